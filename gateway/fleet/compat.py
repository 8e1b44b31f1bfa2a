"""Messages between fleet processes that may run different versions of the gateway (a rolling update).

A worker and its control plane update independently (in Kubernetes the worker and control Deployments roll one
after the other, in either order), so either may hear from a newer one. A newer process may send fields this
version does not know: they are ignored and named (the caller logs them, so an operator sees the skew). A field
this version knows must still be right: a wrong type, a value out of range or a missing required field is
refused, naming it. The models keep ``extra="forbid"``, so the public API's requests, which are user input, stay
strict and documented as such; only the messages between processes of the fleet are parsed through here.

:class:`FleetMessageRoute` is the server side: an ``APIRoute`` whose JSON body is validated by pydantic from the
raw bytes (its JSON parser, not the stdlib's and a second pass over the decoded dict: at a heartbeat of a few
hundred calls that is most of what the request costs), leniently as above; a refused body is a 422 naming what
is wrong, and the unknown fields are left in ``request.state.unknown_fields`` (the control plane logs them per
worker). :class:`LoggedFleetMessageRoute` logs them itself, once per route and set of fields (a worker's command
API: the plane's originate, drain, hang-up, transfer and DTMF, whose data a newer plane may extend).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from gateway.fleet.json_errors import ApiError

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

_MAX_PROBLEMS = 10


def field_path(location: tuple[int | str, ...]) -> str:
    """A field's place in a message, list positions left out: ``('calls', 3, 'stats', 'x')`` -> ``calls.stats.x``."""
    return ".".join(str(part) for part in location if not isinstance(part, int))


def _unknown(error: ValidationError) -> list[str]:
    return sorted({field_path(e["loc"]) for e in error.errors() if e["type"] == "extra_forbidden"})


def parse_message(model: type[M], data: bytes | str) -> tuple[M, list[str]]:
    """``model`` from JSON sent by another process of the fleet, and the paths of the fields it ignored.

    Raises :class:`pydantic.ValidationError` listing only what is wrong with the fields it knows (or the JSON).
    """
    try:
        return model.model_validate_json(data), []
    except ValidationError as error:
        unknown = _unknown(error)
        if not unknown:
            raise
    return model.model_validate_json(data, extra="ignore"), unknown


def parse_answer(model: type[M], data: Any) -> tuple[M, list[str]]:
    """:func:`parse_message` for a message already decoded from JSON (an HTTP client's ``response.json()``)."""
    try:
        return model.model_validate(data), []
    except ValidationError as error:
        unknown = _unknown(error)
        if not unknown:
            raise
    return model.model_validate(data, extra="ignore"), unknown


def describe(error: ValidationError) -> str:
    """What is wrong, one ``field: problem`` per error (as the API's other 422 answers say it)."""
    problems = []
    for detail in error.errors()[:_MAX_PROBLEMS]:
        location = ".".join(str(part) for part in detail["loc"]) or "body"
        problems.append(f"{location}: {detail['msg']}")
    more = error.error_count() - _MAX_PROBLEMS
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


class _FleetMessageRequest(Request):
    def __init__(self, request: Request, model: type[BaseModel], route: FleetMessageRoute) -> None:
        super().__init__(request.scope, request.receive)
        self._model = model
        self._route = route

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json, unknown = parse_message(self._model, await self.body())
            except ValidationError as error:
                raise ApiError(422, "validation_error", describe(error)) from None
            self.state.unknown_fields = unknown
            if unknown:
                self._route.unknown_seen(unknown)
        return self._json


class FleetMessageRoute(APIRoute):
    """A route whose body model is parsed with :func:`parse_message` (FastAPI then takes the parsed model as is)."""

    def unknown_seen(self, fields: list[str]) -> None:
        """A body carried ``fields``, unknown here and ignored (left to the endpoint to tell)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = self.body_field.field_info.annotation if self.body_field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return handler
        body_model: type[BaseModel] = model

        async def parse_then_handle(request: Request) -> Response:
            return await handler(_FleetMessageRequest(request, body_model, self))

        return parse_then_handle


class LoggedFleetMessageRoute(FleetMessageRoute):
    """A :class:`FleetMessageRoute` that logs the fields it ignored, once per set of them."""

    _logged: frozenset[str] = frozenset()

    def unknown_seen(self, fields: list[str]) -> None:
        if frozenset(fields) != self._logged:
            self._logged = frozenset(fields)
            log.warning(
                "%s: the sender runs a newer version; fields this one does not know are ignored: %s",
                self.path,
                ", ".join(fields),
            )
