"""``gateway``'s commands: the product's own, and those that plug in through the ``gateway.commands`` entry points
(the benchmarks, bench/), named with how to install them where they are missing."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from gateway.cli import COMMANDS, PLUGIN_GROUP, build_parser, main


def test_the_installed_bench_plugs_in_as_gateway_bench() -> None:
    # make setup installs bench/ beside the gateway; its entry point brings the command and its arguments.
    args = build_parser().parse_args(["bench", "codecs", "--quick", "--repeats", "1"])
    assert args._plugin.__name__ == "bench.command"
    assert (args.bench, args.quick, args.repeats) == ("codecs", True, 1)


def test_without_the_bench_gateway_bench_says_how_to_install_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "codecs", "--quick"], plugins=[]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gateway bench: the benchmarks are not installed here")
    assert "pip install -e ./bench" in err and "bench/README.md" in err


def test_the_help_lists_a_missing_bench_as_not_installed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"], plugins=[])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "bench (not installed) the benchmarks are not installed here" in out


def test_a_plugin_that_no_longer_loads_is_named_with_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    broken = EntryPoint(name="bench", value="no_such_bench_module.command", group=PLUGIN_GROUP)
    assert main(["bench", "calls"], plugins=[broken]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gateway bench: the bench command is installed but does not load")
    assert "no_such_bench_module" in err


def test_a_plugin_cannot_replace_a_product_command() -> None:
    # An entry point named like a product command is ignored: `gateway run` is always the product's.
    impostor = EntryPoint(name="run", value="no_such_bench_module.command", group=PLUGIN_GROUP)
    args = build_parser([impostor]).parse_args(["run"])
    assert args._module == COMMANDS["run"][0]
