"""moto's S3 server with one request at a time.

moto 5.2.5 checks PutObject's If-None-Match / If-Match and then stores the
object in two separate steps, with no lock between them, and `moto_server`
serves requests on many threads. Under concurrent conditional PUTs of one key
two writers can both win (seen: 2 of 16 racing `If-None-Match: *` creates got
200). Real S3 decides each condition atomically, and Chorus relies on that.
Serializing requests makes every check-and-store atomic again, which is what
the tests need from the server; connections are still served concurrently.

    python serialized_moto_server.py -H 127.0.0.1 -p 5101

Once listening it prints `listening on <port>` to stdout; `-p 0` lets the
system pick a free port, which a caller reads from that line (no race
between finding a free port and binding it).
"""

import argparse
import os
import signal
import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


def serialized(app):
    lock = threading.Lock()

    def handle(environ, start_response):
        with lock:
            # Produce the whole body inside the lock: a lazy body would run
            # moto's code after the lock is released.
            body = app(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                if hasattr(body, "close"):
                    body.close()

    return handle


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(
        args.host,
        args.port,
        serialized(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )
    # moto reads its own port from here (as moto_server sets it).
    os.environ.setdefault("MOTO_PORT", str(server.port))
    print(f"listening on {server.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
