"""Text checks every boundary shares: slugs, session ids, and text the database can
store (no NUL, no unpaired surrogate), as pydantic ``Annotated`` types."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

#: An agent slug: lowercase letters, digits and hyphens, 1-63 characters.
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
#: A session id as the engine makes them (``session-<uuid>``).
SESSION_ID_PATTERN = r"^session-[0-9a-f-]{36}$"


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def check_text(value: str) -> str:
    """Refuse NUL characters and unpaired surrogates (PostgreSQL and UTF-8 cannot store them)."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (no unpaired surrogates)") from exc
    return value


#: Text the database can store (agent specs, API bodies and tool arguments alike).
SafeText = Annotated[str, AfterValidator(check_text)]
#: A task or prompt: storable text that is not blank.
Task = Annotated[str, AfterValidator(check_text), AfterValidator(_not_blank)]
