"""The Refer-To that hands a joined call off with Replaces (gateway/sip/replaces.py), read back as the referee's
side reads it (gateway/sip/refer_sub.py)."""

from __future__ import annotations

from gateway.sip.refer_sub import parse_refer_to
from gateway.sip.replaces import escape_header_value, offers_replaces, refer_to_replacing, replaces_value


def test_the_far_ends_tag_is_the_to_tag_ours_the_from_tag() -> None:
    # RFC 3891 §3: the human's phone matches to-tag against its local tag, from-tag against its remote one (ours).
    assert replaces_value("abc@gw", local_tag="gwtag", remote_tag="humantag") == (
        "abc@gw;to-tag=humantag;from-tag=gwtag"
    )


def test_the_replaces_is_escaped_inside_the_uri() -> None:
    refer_to = refer_to_replacing(
        "sip:human@10.0.0.7:5062;transport=tcp;ob", "a84b4c76e66710@pc33.example", local_tag="1928", remote_tag="a6c8"
    )
    assert refer_to == (
        "sip:human@10.0.0.7:5062;transport=tcp;ob"
        "?Replaces=a84b4c76e66710%40pc33.example%3Bto-tag%3Da6c8%3Bfrom-tag%3D1928"
    )
    target = parse_refer_to([f"<{refer_to}>"])
    assert target.uri == "sip:human@10.0.0.7:5062;transport=tcp;ob"
    assert target.replaces == "a84b4c76e66710@pc33.example;to-tag=a6c8;from-tag=1928"


def test_headers_of_the_contact_are_dropped_and_odd_characters_escaped() -> None:
    refer_to = refer_to_replacing("sip:h@pbx?X-Foo=1", "id with space&%", local_tag="t;1", remote_tag="t=2")
    assert refer_to.startswith("sip:h@pbx?Replaces=") and "X-Foo" not in refer_to
    assert escape_header_value("id with space&%") == "id%20with%20space%26%25"
    assert parse_refer_to([f"<{refer_to}>"]).replaces == "id with space&%;to-tag=t=2;from-tag=t;1"


def test_a_caller_offers_replaces_when_allow_and_supported_say_so() -> None:
    headers = [("Allow", "INVITE, ACK, BYE, REFER, NOTIFY"), ("Supported", "replaces, timer")]
    assert offers_replaces(headers)
    assert offers_replaces([("allow", "refer"), ("k", "100rel"), ("k", "Replaces")])
    assert not offers_replaces([("Allow", "INVITE, BYE"), ("Supported", "replaces")])
    assert not offers_replaces([("Allow", "INVITE, REFER")])
