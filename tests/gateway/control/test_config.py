"""Routes/profiles TOML: a full example loads; bad files fail naming the file, the key and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.control.config import ConfigError, default_config, load_config

FULL = """
[limits]
max_calls = 50
retry_after_s = 3

[fleet]
heartbeat_interval_s = 1.5
lost_after_missed = 4

[[routes]]
name = "support"
did = "+15550199"
profile = "support"
max_calls = 10

[[routes]]
name = "uk"
did_regex = '^\\+44(20|161)'
profile = "support"

[[routes]]
name = "fallback"
did = "*"
profile = "echo"
webrtc_public = true

[profiles.echo]
provider = "echo"

[profiles.support]
provider = "openai"
model = "gpt-realtime"
voice = "marin"
instructions = "You help callers with orders."
greeting = "Thanks for calling."
max_duration_s = 900
turn_detection = { kind = "semantic_vad" }

[[profiles.support.tools]]
name = "lookup_order"
description = "Find an order"
parameters = { type = "object", properties = { order_id = { type = "string" } }, required = ["order_id"] }
url = "https://orders.example.net/lookup"
timeout_s = 4
auth_header = "Bearer s3cret"

[[profiles.support.tools]]
name = "hang_up"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def test_full_example_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.limits.max_calls == 50 and config.fleet.lost_after_s == 6.0
    assert [r.name for r in config.routes] == ["support", "uk", "fallback"]
    assert config.resolve("+15550199").name == "support"  # type: ignore[union-attr]
    assert config.resolve("+442071234").name == "uk"  # type: ignore[union-attr]
    assert config.resolve("+4413").name == "fallback"  # type: ignore[union-attr]
    support = config.profiles["support"]
    webhook = support.webhook_for("lookup_order")
    assert webhook is not None and webhook.timeout_s == 4 and webhook.auth_header == "Bearer s3cret"
    assert "s3cret" not in repr(support)
    assert support.webhook_for("hang_up") is None
    profile = support.to_agent_profile()
    assert profile.provider == "openai" and profile.turn_detection.kind == "semantic_vad"
    assert [t.name for t in profile.tools] == ["lookup_order", "hang_up"]
    assert profile.tools[0].parameters["required"] == ["order_id"]


def test_default_config_routes_everything_to_the_default_provider() -> None:
    config = default_config()
    route = config.resolve("anything at all")
    # "default" is resolved by the worker to GATEWAY_PROVIDER (the echo agent unless set)
    assert route is not None and config.profile_for(route).provider == "default"
    assert load_config(None).routes == config.routes


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (
            "[[routes]]\nname = 'a'\ndid = '1'\nprofile = 'p'\n[profiles.p]\nprovidr = 'echo'\n",
            "profiles.p.providr",
            "Extra inputs",
        ),
        (
            "[[routes]]\nname = 'a'\ndid = '1'\nprofile = 'missing'\n[profiles.p]\n",
            "routes[0].profile",
            "unknown profile 'missing' (known: p)",
        ),
        ("[[routes]]\nname = 'a'\nprofile = 'p'\n[profiles.p]\n", "routes[0]", "exactly one of did"),
        (
            "[[routes]]\nname = 'a'\ndid_regex = '(+'\nprofile = 'p'\n[profiles.p]\n",
            "routes[0].did_regex",
            "not a valid regular expression",
        ),
        (
            "[limits]\nmax_calls = -1\n[[routes]]\nname='a'\ndid='*'\nprofile='p'\n[profiles.p]\n",
            "limits.max_calls",
            "greater than or equal to 0",
        ),
        (
            "[[routes]]\nname='a'\ndid='*'\nprofile='p'\n[profiles.p]\n[[profiles.p.tools]]\nname='t'\nurl='ftp://x'\n",
            "profiles.p.tools[0].url",
            "should match pattern",
        ),
        (
            "[[routes]]\nname='a'\ndid='*'\nprofile='p'\n[profiles.p]\n[[profiles.p.tools]]\nname='t'\n"
            "parameters={type='string'}\n",
            "profiles.p.tools[0].parameters",
            "JSON schema object",
        ),
        (
            "[[routes]]\nname='a'\ndid='1'\nprofile='p'\n[[routes]]\nname='a'\ndid='2'\nprofile='p'\n[profiles.p]\n",
            "routes[1].name",
            "duplicate route name 'a'",
        ),
        ("[profiles.p]\n", "routes", "at least one [[routes]]"),
        (
            "[[routes]]\nname='a'\ndid='*'\nprofile='p'\n[profiles.p]\nmax_duration_s='long'\n",
            "profiles.p.max_duration_s",
            "valid number",
        ),
    ],
)
def test_bad_files_name_file_key_and_problem(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f"{path}: {key}: " in message, message
    assert problem in message, message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = "[[routes]]\nname='a'\ndid='1'\nprofile='x'\n[[routes]]\nname='b'\ndid='2'\nprofile='y'\n[profiles.p]\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert "routes[0].profile" in str(caught.value) and "routes[1].profile" in str(caught.value)


def test_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\nmax_calls = = 3\n")
    with pytest.raises(ConfigError, match=rf"{path}: not valid TOML: .*line 2"):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "absent.toml")


def test_gateway_config_env_is_used_by_create_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.control.app import create_app
    from gateway.control.settings import ControlSettings

    monkeypatch.setenv("GATEWAY_CONFIG", str(write(tmp_path, FULL)))
    app = create_app(ControlSettings())
    assert [r.name for r in app.state.plane.config.routes] == ["support", "uk", "fallback"]
    monkeypatch.setenv("GATEWAY_CONFIG", str(write(tmp_path, "[limits]\nmax_calls = 'x'\n")))
    with pytest.raises(ConfigError, match=r"limits\.max_calls"):
        create_app(ControlSettings())


CONTEXT_CONFIG = """
[context]
headers = ["X-Account"]
trusted_sources = ["10.0.0.0/8"]

[[routes]]
name = "support"
did = "*"
profile = "agent"

[profiles.agent]
instructions = "Caller {caller_number} on account {headers.X-Account}."
greeting = "Hello {caller_name}!"
"""


def test_context_section_reaches_every_profile(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CONTEXT_CONFIG))
    profile = config.profiles["agent"]
    assert profile.context.headers == ["X-Account"]
    assert profile.context.to_policy().trusts("10.1.2.3")


def test_an_unknown_template_name_fails_the_load_naming_it(tmp_path: Path) -> None:
    text = CONTEXT_CONFIG.replace("{headers.X-Account}", "{headers.X-Acount}").replace("{caller_name}", "{callr}")
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    message = str(caught.value)
    assert "profiles.agent.instructions: {headers.X-Acount}: header 'X-Acount' is not in context.headers" in message
    assert "profiles.agent.greeting: {callr}: unknown name" in message


def test_a_bad_context_section_names_the_problem(tmp_path: Path) -> None:
    text = CONTEXT_CONFIG.replace('"10.0.0.0/8"', '"ten.zero"')
    with pytest.raises(ConfigError, match=r"context: not an address or network: 'ten.zero'"):
        load_config(write(tmp_path, text))


HANDOFFS = """
[[routes]]
name = "main"
did = "*"
profile = "front"

[profiles.front]
provider = "openai"
handoffs = ["billing"]

[profiles.billing]
provider = "gemini"
handoffs = ["refunds", "front"]

[profiles.refunds]
provider = "pipeline"

[profiles.lonely]
"""


def test_handoffs_load_with_every_reachable_profile(tmp_path: Path) -> None:
    file = tmp_path / "gateway.toml"
    file.write_text(HANDOFFS)
    config = load_config(file)
    front = config.profiles["front"]
    assert front.handoffs == ["billing"]
    assert sorted(front.handoff_profiles) == ["billing", "front", "refunds"], "through billing, and back"
    assert front.handoff_profiles["billing"].handoffs == ["refunds", "front"]
    assert front.handoff_profiles["billing"].handoff_profiles == {}, "one flat closure, not a nest"
    assert front.to_agent_profile().handoffs == ("billing",)
    assert config.profiles["lonely"].handoff_profiles == {}


@pytest.mark.parametrize(
    ("handoffs", "extra", "problem"),
    [
        ('["nobody"]', "", "profiles.front.handoffs: unknown profile 'nobody' (known: billing, front)"),
        ('["front"]', "", "profiles.front.handoffs: a profile cannot hand off to itself ('front')"),
        (
            '["billing"]',
            '[[profiles.front.tools]]\nname = "transfer_to_billing"\n',
            "the handoff to 'billing' is the tool 'transfer_to_billing', which the profile already has",
        ),
    ],
)
def test_bad_handoffs_fail_the_load(tmp_path: Path, handoffs: str, extra: str, problem: str) -> None:
    file = tmp_path / "gateway.toml"
    file.write_text(
        '[[routes]]\nname = "main"\ndid = "*"\nprofile = "front"\n\n'
        f"[profiles.front]\nhandoffs = {handoffs}\n{extra}\n[profiles.billing]\n"
    )
    with pytest.raises(ConfigError) as error:
        load_config(file)
    assert problem in str(error.value)


GUARDRAILS_HEAD = "[[routes]]\nname='a'\ndid='*'\nprofile='p'\n[profiles.p]\nguardrail_every_chars = 24\n"


def test_guardrails_load_into_the_profile_and_the_session_config(tmp_path: Path) -> None:
    text = (
        GUARDRAILS_HEAD
        + "[[profiles.p.guardrails]]\nname='no-acme'\nkind='blocked'\nphrases=['acme corp']\n"
        + "patterns=['free\\s+money']\n"
        + "[[profiles.p.guardrails]]\nname='pii'\nkind='pii'\n"
        + "[[profiles.p.guardrails]]\nname='mod'\nkind='http'\nurl='http://127.0.0.1:9000/moderate'\ntimeout_s=0.5\n"
    )
    profile = load_config(write(tmp_path, text)).profiles["p"]
    assert profile.guardrail_every_chars == 24
    blocked, pii, hook = profile.guardrail_configs()
    assert (blocked.kind, blocked.phrases, blocked.patterns) == ("blocked", ("acme corp",), (r"free\s+money",))
    assert (pii.kind, pii.pii) == ("pii", ("card", "us_ssn"))
    assert (hook.kind, hook.url, hook.timeout_s) == ("http", "http://127.0.0.1:9000/moderate", 0.5)


@pytest.mark.parametrize(
    ("guardrail", "problem"),
    [
        ("name='g'\nkind='blocked'\npatterns=['(+']\n", "not a valid regular expression"),
        ("name='g'\nkind='blocked'\n", "at least one phrase or pattern"),
        ("name='g'\nkind='pii'\npii=['passport']\n", "Input should be 'card' or 'us_ssn'"),
        ("name='g'\nkind='http'\n", "url must be http(s)"),
        ("name='g'\nkind='sentiment'\n", "Input should be 'blocked', 'pii' or 'http'"),
    ],
)
def test_a_bad_guardrail_fails_the_load_naming_it(tmp_path: Path, guardrail: str, problem: str) -> None:
    path = write(tmp_path, GUARDRAILS_HEAD + "[[profiles.p.guardrails]]\n" + guardrail)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "profiles.p.guardrails[0]" in message and problem in message, message


def test_duplicate_guardrail_names_fail_the_load(tmp_path: Path) -> None:
    one = "[[profiles.p.guardrails]]\nname='g'\nkind='pii'\n"
    with pytest.raises(ConfigError, match="duplicate guardrail names: g"):
        load_config(write(tmp_path, GUARDRAILS_HEAD + one + one))


AMD_STT = """
[[routes]]
name = "out"
did = "*"
profile = "agent"

[profiles.agent]
provider = "openai"
amd_stt = { name = "scripted", texts = "Please leave a message" }
"""


def test_amd_stt_reaches_a_realtime_profile(tmp_path: Path) -> None:
    profile = load_config(write(tmp_path, AMD_STT)).profiles["agent"].to_agent_profile()
    assert profile.provider == "openai" and profile.pipeline is None
    assert profile.amd_stt is not None
    assert (profile.amd_stt.name, dict(profile.amd_stt.options)) == ("scripted", {"texts": "Please leave a message"})
    assert load_config(write(tmp_path, FULL)).profiles["support"].to_agent_profile().amd_stt is None


@pytest.mark.parametrize(
    ("amd_stt", "problem"),
    [
        ('{ name = "whispr" }', "profiles.agent.amd_stt: unknown stt component 'whispr' (known: "),
        ('{ name = "scripted", voice = "x" }', "profiles.agent.amd_stt: scripted has no option voice (options: "),
        ('{ name = "synthetic" }', "profiles.agent.amd_stt: unknown stt component 'synthetic'"),  # a tts, not an stt
    ],
)
def test_a_bad_amd_stt_fails_the_load_naming_it(tmp_path: Path, amd_stt: str, problem: str) -> None:
    text = AMD_STT.replace('{ name = "scripted", texts = "Please leave a message" }', amd_stt)
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    message = str(caught.value)
    assert f"{tmp_path / 'gateway.toml'}: {problem}" in message, message
