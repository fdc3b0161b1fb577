"""uvicorn serving an ASGI application on a thread of a daemon: the conductor's front end and every daemon's metrics server."""
