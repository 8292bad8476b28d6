"""Runs gcp-storage-emulator with a listen backlog of 1024 instead of Python's 5.

The emulator is one single-threaded http.server: while it serves one request, the kernel
queues the other connections in the listen backlog. With socketserver's default of 5, a
client that opens dozens of connections at once (wharf's engine keeps hundreds of requests in
flight) has its SYNs dropped and retried after 1, 3, 7... seconds, so a test takes tens of
seconds for a second of work. scripts/gcs-server starts the emulator through this file:

    python3 gcs-emulator-backlog.py <emulator script> <emulator arguments...>
"""
import http.server
import runpy
import sys

http.server.HTTPServer.request_queue_size = 1024
emulator = sys.argv[1]
sys.argv = [emulator] + sys.argv[2:]
runpy.run_path(emulator, run_name="__main__")
