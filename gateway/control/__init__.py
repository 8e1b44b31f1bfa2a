"""Control plane: FastAPI ops API, call placement, worker registry, dashboard, WebRTC offers.

Entry points: :func:`gateway.control.app.create_app` (the ASGI app), :class:`gateway.control.plane.ControlPlane`
(the HTTP-free core), :func:`gateway.control.config.load_config` (routes/profiles TOML) and
:class:`gateway.control.settings.ControlSettings` (GATEWAY_* environment).
"""
