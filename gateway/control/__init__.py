"""Control plane: FastAPI ops API, call placement, worker registry, dashboard, WebRTC offers."""
