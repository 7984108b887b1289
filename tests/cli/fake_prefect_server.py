"""A stand-in Prefect server process: `python fake_prefect_server.py server PORT HOME [hang]`.

Answers /api/health and /api/admin/settings (with ``home``) like Prefect does; with
``hang`` it listens but never answers. Its command line names "prefect" and
"server", as a real one's does, so the registry recognises it.
"""
import http.server
import json
import sys
import time


def main() -> None:
    _, _, port, home, *mode = sys.argv

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server name
            if mode == ["hang"]:
                time.sleep(3600)
            body = {"/api/health": b"true", "/api/admin/settings": json.dumps({"home": home}).encode()}
            found = body.get(self.path)
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(found or b"")

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
