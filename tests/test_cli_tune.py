"""``stallscope tune``'s command line: usage errors are one line and exit 2, before any trial."""

from __future__ import annotations

import pytest

from stallscope.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune"], "no command to tune"),
        (["tune", "--"], "no command to tune"),
        (["tune", "--budget", "0", "--", "python", "x.py"], "budget must be > 0"),
        (["tune", "--steps", "0", "--", "python", "x.py"], "steps must be >= 1"),
        (["tune", "--rounds", "1", "--", "python", "x.py"], "min_rounds"),
        (["tune", "--min-saving", "1.5", "--", "python", "x.py"], "min_saving"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("stallscope: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_a_command_that_cannot_start_is_reported_and_exits_2(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    out = f"{tmp_path}/tune.json"
    assert main(["tune", "--out", out, "--", "/nonexistent/python\x1b[31m", "x.py"]) == 2
    text = capsys.readouterr().out
    assert "could not start the command" in text
    assert "\x1b" not in text
