#!/usr/bin/env bash
# stallscope-gate.sh: run a reference training command under StallScope, then fail the build when
# the accelerator's idle fraction regressed against a committed baseline (`stallscope check`).
#
# The GitHub action (integrations/github/action.yml) and the GitLab template
# (integrations/gitlab/stallscope.gitlab-ci.yml) both call this script; it runs anywhere with bash
# and a Python that has stallscope installed, so `bash integrations/stallscope-gate.sh` reproduces
# a CI verdict on your machine.
#
# Settings, as environment variables:
#   STALLSCOPE_COMMAND       the reference training command, run with `bash -c`
#                            (or give the command as this script's arguments instead)
#   STALLSCOPE_REPORT        the report the command writes       (default: stallscope/report.json)
#   STALLSCOPE_BASELINE      the committed baseline report       (needed unless STALLSCOPE_MAX_IDLE)
#   STALLSCOPE_MAX_INCREASE  largest allowed idle increase        (default: 0.02 = 2 points)
#   STALLSCOPE_MAX_IDLE      fail above this idle fraction        (default: no ceiling)
#   STALLSCOPE_PYTHON        the Python with stallscope installed (default: python3, then python)
#   STALLSCOPE_GITHUB        1: markdown step summary and ::error annotation (the action sets it)
#   STALLSCOPE_CHECK_ARGS    more arguments for `stallscope check`, e.g. "--min-windows 4"
#
# Exit status: that of `stallscope check` (0 no regression, 1 regression, 2 error), or 2 when the
# reference command fails or does not write a new report.
set -u -o pipefail

die() {
    echo "stallscope-gate: error: $*" >&2
    if [ "${STALLSCOPE_GITHUB:-0}" = "1" ]; then
        local msg="$*"
        echo "::error title=StallScope gate::${msg//%/%25}"
    fi
    exit 2
}

report="${STALLSCOPE_REPORT:-stallscope/report.json}"
baseline="${STALLSCOPE_BASELINE:-}"
max_increase="${STALLSCOPE_MAX_INCREASE:-0.02}"
max_idle="${STALLSCOPE_MAX_IDLE:-}"
github="${STALLSCOPE_GITHUB:-0}"

python="${STALLSCOPE_PYTHON:-}"
if [ -z "$python" ]; then
    python="$(command -v python3 || command -v python || true)"
    [ -n "$python" ] || die "no python3 or python on PATH; set STALLSCOPE_PYTHON"
fi
if ! problem="$("$python" -c "import stallscope.cli" 2>&1)"; then
    die "cannot import stallscope with $python (${problem##*$'\n'}); pip install stallscope, or set STALLSCOPE_PYTHON"
fi

# the report file itself, also when the setting names its folder
if [ -d "$report" ]; then
    report_file="$report/report.json"
elif [ -f "$report" ] || [[ "$report" == *.json ]]; then
    report_file="$report"
else
    report_file="$report/report.json"
fi

[ -n "$baseline" ] || [ -n "$max_idle" ] || die "set STALLSCOPE_BASELINE (a committed report.json) or STALLSCOPE_MAX_IDLE"
if [ -n "$baseline" ] && [ ! -e "$baseline" ]; then
    die "baseline $baseline does not exist; record one by running the reference command and committing its report: cp $report_file $baseline"
fi

if [ "$#" -eq 0 ] && [ -z "${STALLSCOPE_COMMAND:-}" ]; then
    die "set STALLSCOPE_COMMAND to the reference training command (or give it as arguments)"
fi
# to tell a fresh report from one left over by an earlier run: its content or its mtime changes
before="$(cksum "$report_file" 2>/dev/null || true)"
marker="$(mktemp "${TMPDIR:-/tmp}/stallscope-gate.XXXXXX")" || die "cannot create a temporary file"
trap 'rm -f "$marker"' EXIT

[ "$github" = "1" ] && echo "::group::StallScope reference run"
if [ "$#" -gt 0 ]; then
    "$@"
else
    bash -c "$STALLSCOPE_COMMAND"
fi
status=$?
[ "$github" = "1" ] && echo "::endgroup::"
[ "$status" -eq 0 ] || die "the reference command failed (exit $status); no verdict"

[ -f "$report_file" ] || die "the reference command wrote no report at $report (check STALLSCOPE_REPORT and the command's report_dir)"
after="$(cksum "$report_file")"
[ "$before" != "$after" ] || [ "$report_file" -nt "$marker" ] || die "$report_file was not rewritten by the reference command (a stale report?)"

args=(check "$report" --max-increase "$max_increase")
[ -n "$baseline" ] && args+=(--baseline "$baseline")
[ -n "$max_idle" ] && args+=(--max-idle "$max_idle")
[ "$github" = "1" ] && args+=(--github)
if [ -n "${STALLSCOPE_CHECK_ARGS:-}" ]; then
    read -r -a extra <<<"$STALLSCOPE_CHECK_ARGS"
    args+=("${extra[@]}")
fi
rm -f "$marker"
exec "$python" -m stallscope.cli "${args[@]}"
