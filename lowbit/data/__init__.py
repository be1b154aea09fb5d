"""Data sets for calibration and evaluation, read from the shared data folder."""

from .calibration import calibration_ids, calibration_text
from .paths import DataNotFoundError, data_file, data_root

__all__ = ["calibration_ids", "calibration_text", "DataNotFoundError", "data_file", "data_root"]
