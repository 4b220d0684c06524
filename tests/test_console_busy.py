"""The console's composer while a turn runs and the review card's edit box (docs/console.md),
in Debian's chromium via Playwright against the real API + worker + dev server."""

from __future__ import annotations

import json
import time
from typing import Any

from playwright.sync_api import Page, Route, expect

from tests.test_api_reviews import decide, poll
from tests.test_console import (  # noqa: F401  (the fixtures)
    Stack,
    _agent,
    _caller,
    _launch,
    _review_of,
    _wait_status,
    browser,
    page,
    stack,
)


def _last_text(st: Stack, sid: str) -> str:
    msgs = st.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    return str(msgs[-1]["text"])


def _allow_edited(st: Stack, on: Page, sid: str, edits: dict[str, str]) -> dict[str, Any]:
    """On the session page, fill the review card's edit fields (label → text) and Allow
    once; the tool result the caller echoed once its turn is over."""
    card = on.locator(f'[data-review="{_review_of(st.http, sid)}"]')
    for label, text in edits.items():
        card.get_by_label(label).fill(text)
    card.get_by_role("button", name="Allow once").click()
    expect(card.locator(".outcome")).to_have_text("Allowed by local")
    _wait_status(st.http, sid, "idle")
    result: dict[str, Any] = json.loads(_last_text(st, sid).removeprefix("RESULT "))
    return result


def test_an_edited_allow_and_an_interrupt_from_the_session_page(
    stack: Stack,  # noqa: F811  (the fixture imported above)
    page: Page,  # noqa: F811
) -> None:
    """On the session page a review card's edit box sends the edited message with Allow
    once; while a turn runs the composer offers to interrupt it, which withdraws the
    review it waits on and answers the new message."""
    _caller(stack.http, "caller-e")
    sid = _launch(stack.http, {"agent": "caller-e", "prompt": "go"})
    _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    expect(page.get_by_label("While the turn runs")).to_be_visible()
    result = _allow_edited(
        stack, page, sid, {"Edit the message before allowing it": "hello, edited"}
    )
    assert result["sent_prompt"] == "hello, edited" and "edited your message" in result["note"]
    expect(page.get_by_label("While the turn runs")).to_be_hidden()

    page.get_by_label("Your message").fill("go2")
    page.get_by_role("button", name="Send").click()
    second = _review_of(stack.http, sid)
    expect(page.get_by_label("While the turn runs")).to_be_visible()
    page.get_by_label("While the turn runs").select_option("interrupt")
    page.get_by_label("Your message").fill("never mind")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(f'[data-review="{second}"] .outcome')).to_contain_text("Withdrawn")
    # Between the interrupted turn and the new message's the session may read idle for
    # a moment: wait for the answer to the new message to be the transcript's last.
    deadline = time.monotonic() + 30
    while "never mind" not in _last_text(stack, sid):
        assert time.monotonic() < deadline, _last_text(stack, sid)
        time.sleep(0.1)
    _wait_status(stack.http, sid, "idle")


def test_an_edit_typed_before_the_review_card_is_filled_in_is_kept(
    stack: Stack,  # noqa: F811  (the fixture imported above)
    page: Page,  # noqa: F811
) -> None:
    """The session page shows a review card from the stream, then fills it in from
    ``GET /v1/reviews/{id}``; a message edit typed before that answer arrives stays in the
    box and is what Allow once sends (the refill used to empty it, allowing the call as
    written)."""
    held: list[Route] = []

    def hold_the_first_read(route: Route) -> None:
        if route.request.method == "GET" and not held:
            held.append(route)  # answered below, once the edit is typed
        else:
            route.continue_()

    page.route("**/v1/reviews/review-*", hold_the_first_read)
    _caller(stack.http, "caller-k")
    sid = _launch(stack.http, {"agent": "caller-k", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    card = page.locator(f'[data-review="{rid}"]')
    box = card.get_by_label("Edit the message before allowing it")
    box.fill("hello, edited early")
    while not held:
        page.wait_for_timeout(20)  # the card's own read is on its way
    held[0].continue_()
    expect(card.locator(".countdown")).to_be_visible()  # filled in from the answer
    expect(box).to_have_value("hello, edited early")
    card.get_by_role("button", name="Allow once").click()
    expect(card.locator(".outcome")).to_have_text("Allowed by local")
    _wait_status(stack.http, sid, "idle")
    result = json.loads(_last_text(stack, sid).removeprefix("RESULT "))
    assert result["sent_prompt"] == "hello, edited early"


def test_messages_queued_from_the_composer_run_in_order_after_the_turn(
    stack: Stack,  # noqa: F811  (the fixture imported above)
    page: Page,  # noqa: F811
) -> None:
    """While a turn waits on a review, the composer's "send it next" queues two messages;
    once the review is allowed, each runs as its own turn, in the order they were sent."""
    playbook: list[dict[str, Any]] = [
        {"when": "^invoke_agent: ", "reply": "RESULT {last_message}"},
        {
            "when": "^go$",
            "reply": "Calling.",
            "tool_calls": [{"tool": "invoke_agent", "args": {"slug": "target", "prompt": "hi"}}],
        },
        {"reply": "got {last_message}"},
    ]
    _agent(stack.http, "queuer", playbook=playbook)
    sid = _launch(stack.http, {"agent": "queuer", "prompt": "go"})
    review = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    busy = page.get_by_label("While the turn runs")
    expect(busy).to_be_visible()
    for prompt in ("first queued", "second queued"):
        busy.select_option("enqueue")
        page.get_by_label("Your message").fill(prompt)
        page.get_by_role("button", name="Send").click()
        expect(page.get_by_label("Your message")).to_have_value("")  # the API took it
    expect(page.locator("#compose-error")).to_be_hidden()

    def said(role: str) -> list[str]:
        msgs = stack.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        return [str(m["text"]) for m in msgs if m["role"] == role]

    assert said("user") == ["go"]  # held by the workflow until the turn ends
    # The module's reviews time out after 25 s: on a loaded machine it may have, which ends
    # the turn as well (409); the queue then drains the same way.
    assert decide(stack.http, review, "allow_once").status_code in (200, 409)
    poll(lambda: "got second queued" in said("assistant"), "the second queued reply")
    assert said("user") == ["go", "first queued", "second queued"]
    replies = said("assistant")
    assert replies.index("got first queued") < replies.index("got second queued")
    _wait_status(stack.http, sid, "idle")


def test_a_create_review_card_edits_the_name_and_instructions(
    stack: Stack,  # noqa: F811  (the fixture imported above)
    page: Page,  # noqa: F811
) -> None:
    """A create's review card offers the new agent's name and instructions to edit (and no
    message edit); Allow once creates the agent with the reviewer's values."""
    playbook = [
        {"when": "^create_agent: ", "reply": "RESULT {last_message}"},
        {
            "when": "^make$",
            "reply": "Creating.",
            "tool_calls": [{"tool": "create_agent", "args": {"name": "Rough Draft"}}],
        },
    ]
    assert stack.http.post(
        "/v1/agents", json={"slug": "maker-e", "name": "maker-e", "spec": {"playbook": playbook}}
    ).is_success
    assert stack.http.post("/v1/agents/maker-e/publish").is_success
    sid = _launch(stack.http, {"agent": "maker-e", "prompt": "make"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    card = page.locator(f'[data-review="{rid}"]')
    expect(card.get_by_label("Edit the new agent's name")).to_be_visible()
    expect(card.get_by_label("Edit the message before allowing it")).to_have_count(0)
    edits = {
        "Edit the new agent's name": "Polished Agent",
        "Edit the new agent's instructions": "answer in one line",
    }
    result = _allow_edited(stack, page, sid, edits)
    assert result["slug"] == "polished-agent" and "edited your request" in result["note"]
    live = stack.http.get("/v1/agents/polished-agent/revisions/1").json()
    assert live["spec"]["system_prompt"] == "answer in one line"
