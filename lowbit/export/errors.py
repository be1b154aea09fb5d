"""The one error an export raises for what the target format cannot hold."""

from lowbit.errors import LowbitError


class ExportError(LowbitError, ValueError):
    """The checkpoint holds something the target format cannot express; the message names the
    scheme field or layer and says what would export."""
