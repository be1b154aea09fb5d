"""A stand-in for ``vllm serve`` in the serving benchmark's tests: ``python fake_openai_server.py
PORT MODE``. It streams ``/v1/completions`` as vLLM does (server-sent events in a chunked HTTP/1.1
body, one token per event with ``token_ids``, a usage event, ``[DONE]``) and starts a child
process, so stopping must end a whole tree. MODE: ``ok``; ``slow-start`` (healthy after 1 s);
``never-healthy``; ``crash`` (exits at once); ``deaf`` (ignores SIGTERM); ``short`` (one token
fewer than asked); ``error`` (HTTP 400)."""

import json
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODE = int(sys.argv[1]), sys.argv[2]
START = time.monotonic()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        healthy = MODE != "never-healthy" and (MODE != "slow-start" or time.monotonic() - START > 1)
        self.send_response(200 if healthy and self.path == "/health" else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if MODE == "error":
            msg = b'{"error": "bad request"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        n = body["max_tokens"] - (MODE == "short")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(n):
            time.sleep(0.01)
            event = {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [100 + i]}], "usage": None}
            self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
        self._chunk(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self._chunk(b"")


if __name__ == "__main__":
    if MODE == "crash":
        print("fake server: cannot load the model", flush=True)
        sys.exit(3)
    if MODE == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the engine-core stand-in
    print(f"fake server: child {child.pid}, listening on {PORT}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
