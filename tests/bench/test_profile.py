"""Sampled stacks grouped into the categories of docs/performance.md (py-spy raw and perf script text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._profile import INTERPRETED, categorize, categorize_perf, main, perf_samples


def test_py_spy_stacks_are_charged_to_the_innermost_frame_with_a_category() -> None:
    lines = [
        "_run (asyncio/events.py:80);_on_tick (gateway/worker/worker.py:355);b64encode (base64.py:58) 7",
        "_run (asyncio/events.py:80);_on_tick (gateway/worker/worker.py:355);push (gateway/session/pipe.py:90) 5",
        "_run (asyncio/events.py:80);__call__ (gateway/transport/rtp_socket.py:95) 3",
        "main (somewhere/else.py:1) 2",
        "not a sample line",
    ]
    assert categorize(lines) == {"JSON/base64": 7, "session bookkeeping": 5, "RTP I/O": 3, "other": 2}


PERF_SCRIPT = """
    7f01 __sys_sendto ([kernel.kallsyms])
    55a1 CPyDef_rtp_socket___RtpEndpoint____send (rtp_socket.cpython-311-x86_64-linux-gnu.so)
    55a2 CPyDef_worker___MediaWorker____on_tick (worker.cpython-311-x86_64-linux-gnu.so)

    7f02 dgemm_kernel_HASWELL (libopenblas64_p-r0-0cf96a72.3.23.dev.so)
    55a3 CPyDef_tick___TickEngine____inbound_g711 (tick.cpython-311-x86_64-linux-gnu.so)

    7f03 _Py_dict_lookup (python3.11)
    55a4 CPyDef_session___CallSession___push_inbound (session.cpython-311-x86_64-linux-gnu.so)
    55a5 CPyDef_worker___MediaWorker____on_tick (worker.cpython-311-x86_64-linux-gnu.so)

    7f04 _PyEval_EvalFrameDefault (python3.11)
    7f05 __pyx_f_6uvloop_4loop_run_in_context1 (loop.cpython-311-x86_64-linux-gnu.so)

    7f06 asm_sysvec_apic_timer_interrupt ([kernel.kallsyms])
    55a6 CPyDef_jitter___JitterBuffer___pop (jitter.cpython-311-x86_64-linux-gnu.so)
"""


def test_perf_samples_go_to_their_system_call_library_or_innermost_compiled_module() -> None:
    samples = perf_samples(PERF_SCRIPT)
    assert [len(sample) for sample in samples] == [3, 2, 3, 2, 2]
    assert samples[0][0] == ("__sys_sendto", "[kernel.kallsyms]")
    assert categorize_perf(samples) == {
        "RTP I/O: UDP system calls": 1,  # the system call, wherever it is in the stack
        "DSP and arrays (numpy/BLAS)": 1,  # the library doing the work, not the tick that called it
        "session and provider adapter": 1,  # the interpreter's dict lookup, charged to the compiled caller
        INTERPRETED: 1,  # Python the loop called is not the loop's own time
        "kernel, other (interrupts, scheduler, page faults)": 1,
    }


def test_the_command_line_names_a_missing_or_unreadable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "missing.txt")])
    assert exited.value.code == 2 and "no such file:" in capsys.readouterr().err
    raw = tmp_path / "spy.txt"
    raw.write_text("_run (asyncio/events.py:80);__call__ (gateway/transport/rtp_socket.py:95) 4\n")
    assert main([str(raw)]) == 0
    assert "RTP I/O  100.0 %  (4 samples)" in capsys.readouterr().out
