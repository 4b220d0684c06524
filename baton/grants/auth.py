"""Auth mode: users, bearer API tokens and agent ACLs (Gamut X-Agent Policies, 'Auth mode
considerations').

With ``BATON_AUTH=off`` (the default) there is one local user, ``local``, who
can do everything. With ``on``, every API request carries ``Authorization:
Bearer <token>``; tokens map to users and are stored as SHA-256 digests only
(they are 256-bit random, so a fast hash is enough). Roles on an agent order
``viewer < user < owner``: reading another agent's sessions needs viewer,
invoking it needs user, changing it needs owner.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from typing import Literal, NamedTuple

from sqlmodel import Session, col, select

from baton.errors import BatonError, Conflict, NotFound
from baton.storage.db import AgentAcl, ApiToken, User

Role = Literal["viewer", "user", "owner"]
ROLE_RANK: dict[str, int] = {"viewer": 1, "user": 2, "owner": 3}
LOCAL_USER = "local"
USER_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
TOKEN_PREFIX = "baton_"


class Unauthorized(BatonError):
    """No valid bearer token (401)."""

    code = "unauthorized"
    status = 401
    title = "Unauthorized"


class Forbidden(BatonError):
    """The user's role on the agent is not enough (403)."""

    code = "forbidden"
    status = 403
    title = "Forbidden"


class UserNotFound(NotFound):
    """No user with this id."""

    code = "user_not_found"


class UserExists(Conflict):
    """A user with this id already exists."""

    code = "user_exists"


class InvalidUser(BatonError):
    """A user id that is not ``^[a-z0-9][a-z0-9._-]{0,62}$``."""

    code = "invalid_user"
    status = 422


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_user(session: Session, *, user_id: str, name: str = "") -> User:
    """Add a user. Raises InvalidUser, UserExists."""
    if not USER_ID.match(user_id):
        raise InvalidUser(f"user id must match {USER_ID.pattern}", path="user_id")
    if session.get(User, user_id) is not None:
        raise UserExists(f"user '{user_id}' already exists")
    user = User(id=user_id, name=name)
    session.add(user)
    session.flush()
    return user


def get_user(session: Session, *, user_id: str) -> User:
    """The user. Raises UserNotFound."""
    user = session.get(User, user_id)
    if user is None:
        raise UserNotFound(f"no user '{user_id}'")
    return user


def list_users(session: Session) -> list[User]:
    """Every user, by id."""
    return list(session.exec(select(User).order_by(col(User.id))).all())


def issue_token(session: Session, *, user_id: str, name: str = "") -> tuple[ApiToken, str]:
    """A new token for ``user_id``: ``(row, plaintext)``; the plaintext is shown once."""
    get_user(session, user_id=user_id)
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(user_id=user_id, token_hash=_digest(plain), prefix=plain[:12], name=name)
    session.add(row)
    session.flush()
    return row, plain


def list_tokens(session: Session, *, user_id: str | None = None) -> list[ApiToken]:
    """Tokens (never their plaintext), optionally of one user."""
    stmt = select(ApiToken).order_by(col(ApiToken.id))
    if user_id is not None:
        stmt = stmt.where(ApiToken.user_id == user_id)
    return list(session.exec(stmt).all())


def revoke_token(session: Session, *, token_id: int) -> ApiToken:
    """Revoke a token by id. Raises NotFound."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"no token {token_id}")
    row.revoked = True
    session.add(row)
    session.flush()
    return row


def user_for_token(session: Session, token: str) -> str:
    """The user a bearer token belongs to. Raises Unauthorized."""
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == _digest(token))).first()
    if row is None or row.revoked:
        raise Unauthorized("invalid or revoked API token")
    return row.user_id


def role_of(session: Session, *, user_id: str, agent: str) -> str | None:
    """The user's role on ``agent``, or None."""
    row = session.get(AgentAcl, (agent, user_id))
    return row.role if row else None


def has_role(session: Session, *, user_id: str, agent: str, role: Role) -> bool:
    """Whether the user's role on ``agent`` is at least ``role``."""
    held = role_of(session, user_id=user_id, agent=agent)
    return held is not None and ROLE_RANK[held] >= ROLE_RANK[role]


def require(session: Session, *, user_id: str, agent: str, role: Role) -> None:
    """Raise Forbidden unless the user holds at least ``role`` on ``agent``."""
    if not has_role(session, user_id=user_id, agent=agent, role=role):
        raise Forbidden(f"user '{user_id}' needs the {role} role on agent '{agent}'")


#: The role a spec reference needs on the agent it names. ``extends``
#: folds the base's prompt, playbook and tools into the derived agent, which shows and
#: uses them: reading. A subagent node is run by the tree: the role invoking it needs.
EXTENDS_ROLE: Role = "viewer"
SUBAGENT_ROLE: Role = "user"


class Reference(NamedTuple):
    """One agent a spec or a resolved view names: the slug, where (``path``), the role needed."""

    agent: str
    path: str
    role: Role


def require_references(session: Session, *, user_id: str, references: Iterable[Reference]) -> None:
    """Raise Forbidden (403, with the reference's ``path`` and ``agent``) for the first
    reference on whose agent the user lacks its role.

    An agent that does not exist is refused the same way (nobody holds a role on
    it), so the answer never tells whether a hidden agent exists, as for
    ``/v1/agents/{slug}``. Auth mode only: callers pass no user with auth off.
    """
    for ref in references:
        if not has_role(session, user_id=user_id, agent=ref.agent, role=ref.role):
            msg = (
                f"user '{user_id}' needs the {ref.role} role on agent '{ref.agent}', "
                f"referenced at {ref.path}"
            )
            raise Forbidden(msg, path=ref.path, agent=ref.agent, role=ref.role)


def accessible(session: Session, *, user_id: str, role: Role = "viewer") -> list[str]:
    """Slugs of the agents on which the user holds at least ``role``."""
    rows = session.exec(select(AgentAcl).where(AgentAcl.user_id == user_id)).all()
    return sorted(r.agent_slug for r in rows if ROLE_RANK[r.role] >= ROLE_RANK[role])


def grant(session: Session, *, agent: str, user_id: str, role: Role) -> None:
    """Set the user's role on ``agent``. Raises UserNotFound."""
    get_user(session, user_id=user_id)
    row = session.get(AgentAcl, (agent, user_id))
    if row is None:
        session.add(AgentAcl(agent_slug=agent, user_id=user_id, role=role))
    else:
        row.role = role
        session.add(row)
    session.flush()


def revoke(session: Session, *, agent: str, user_id: str) -> bool:
    """Remove the user's role on ``agent``; whether there was one."""
    row = session.get(AgentAcl, (agent, user_id))
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True


def acl(session: Session, *, agent: str) -> dict[str, str]:
    """``{user_id: role}`` for ``agent``."""
    rows = session.exec(select(AgentAcl).where(AgentAcl.agent_slug == agent)).all()
    return {r.user_id: r.role for r in rows}


def copy_acl(session: Session, *, source: str, target: str, owner: str | None) -> None:
    """Give ``target`` the ACL of ``source``, and ``owner`` the owner role (create_agent).

    Gamut X-Agent Policies: 'create_agent copies the caller's owner ACL to the new agent, so
    the owner automatically has access.'
    """
    for user_id, role in acl(session, agent=source).items():
        grant(session, agent=target, user_id=user_id, role=role)  # type: ignore[arg-type]
    if owner is not None and session.get(User, owner) is not None:
        grant(session, agent=target, user_id=owner, role="owner")


def delete_for_agent(session: Session, *, slug: str) -> None:
    """Drop every ACL row of ``slug`` (the agent is being deleted)."""
    for row in session.exec(select(AgentAcl).where(AgentAcl.agent_slug == slug)).all():
        session.delete(row)
    session.flush()
