"""The `http` settings: a light model the configuration reads without the HTTP server."""

from __future__ import annotations

from pydantic import Field

from exporter.core.models import StrictModel


class HttpConfig(StrictModel):
    request_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds a client has to complete the TLS handshake and send a request's "
        "headers, and again to take the response; then the connection is cut",
    )
    max_connections: int = Field(
        1000, ge=1, description="connections open at once; more are closed on arrival"
    )
