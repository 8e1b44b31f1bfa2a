"""Live call control of a call's agent: say, inject, update (POST /v1/calls/{id}/say|inject|update).

Owns the translation from the fleet's :class:`AgentCommand` to the call's session, and from the session's
state errors to the fleet's: a call whose agent is not up (still ringing, resuming, ending) answers
CommandRejectedError (409 with the reason), an unknown call was already CallNotFoundError (404) in the registry.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import AgentCommand
from gateway.session.errors import ProfileUpdateError, SessionStateError
from gateway.worker.legs import Leg


async def command_session(leg: Leg, command: AgentCommand) -> None:
    """Carry out ``command`` on ``leg``'s session; CommandRejectedError naming why it cannot."""
    session = leg.session
    if session is None or not leg.live:
        raise CommandRejectedError(f"call {leg.id}: its agent is not up ({leg.state.value})")
    try:
        if command.say is not None:
            session.say(command.say.text, interrupt=command.say.interrupt)
        elif command.inject is not None:
            inject = command.inject
            session.inject(inject.text, role=inject.role, respond=inject.respond)
        elif command.update is not None:
            update = command.update
            profile = session.profile
            await session.update_profile(
                replace(
                    profile,
                    instructions=update.instructions if update.instructions is not None else profile.instructions,
                    voice=update.voice if update.voice is not None else profile.voice,
                )
            )
    except (SessionStateError, ProfileUpdateError) as exc:
        raise CommandRejectedError(f"call {leg.id}: {exc}") from None
