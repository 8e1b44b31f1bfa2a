"""SIP: sans-I/O RFC 3261 parser, transactions, dialogs, SDP offer/answer and digest auth.

Where things live (each module's docstring has its rules and RFC sections):

    endpoint.py       SipEndpoint — the one object the transport glue drives (receive / handle_timers /
                      next_deadline / datagrams / events) and the application acts on (answer, hang_up, ...)
    config.py         SipConfig, RateLimit, SessionTimerConfig (frozen); timers.py SipTimers(t1, t2, t4)
    events.py         SipEvent dataclasses, Outgoing, CallHandle, SipStats
    framing.py        StreamFramer for TCP (feed bytes, get whole messages)
    auth.py           Authenticator / ClientCredentials seams and their digest.py adapters
    message.py        parse_message / SipRequest / SipResponse / make_response; uri.py, headers.py, grammar.py
    transaction.py    §17 state tables; dialog.py §12; session_timer.py RFC 4028; policy.py inbound policy
    core.py, uas.py, uac.py, call.py   the user-agent core behind SipEndpoint
    sdp.py, digest.py SDP offer/answer and digest authentication
    errors.py         the error tree
"""
