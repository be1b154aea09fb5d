"""run_json_worker: the result comes back; a failing, silent or hanging worker is a WorkerFailed."""

import sys

import pytest

from lowbit.io.json_worker import WorkerFailed, run_json_worker

WORKER = """
import json, sys, time
req = json.load(open(sys.argv[1]))
print("worker says", req["mode"], flush=True)
if req["mode"] == "ok":
    json.dump({"double": 2 * req["x"]}, open(sys.argv[2], "w"))
elif req["mode"] == "fail":
    sys.exit(3)
elif req["mode"] == "hang":
    time.sleep(60)
"""


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "worker.py"
    p.write_text(WORKER)
    return p


def test_result_and_output_come_back(script):
    result, out = run_json_worker(sys.executable, script, {"mode": "ok", "x": 21}, 60, "test worker")
    assert result == {"double": 42} and "worker says ok" in out


@pytest.mark.parametrize("mode, message", [("fail", r"(?s)test worker failed \(exit 3\).*worker says fail"),
                                           ("silent", r"(?s)failed \(exit 0\).*worker says silent"),
                                           ("hang", r"(?s)test worker ran past 2 s.*worker says hang")])
def test_a_worker_that_fails_writes_nothing_or_hangs_is_named(script, mode, message):
    with pytest.raises(WorkerFailed, match=message):
        run_json_worker(sys.executable, script, {"mode": mode}, 2, "test worker")
