"""Output formats, run for real: ruff-shaped JSON, exact and escaped GitHub annotations, SARIF validated against
the published 2.1.0 schema (tests/data), statistics, output files, colour and progress only on a terminal, and
baselines whose fingerprints survive unrelated edits."""

from __future__ import annotations

import copy
import io
import json
import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from samples import BAD, REPO

SCHEMA = Path(__file__).resolve().parent / "data" / "sarif-schema-2.1.0.json"

MULTILINE = textwrap.dedent("""\
    import torch


    def rl_update(policy, optimizer, obs_np, device):
        for _ in range(4):
            obs = torch.from_numpy(obs_np).float().to(
                device
            )
            loss = policy(obs).mean()
            loss.backward()
            optimizer.step()
""")
MESSAGE = "Host-to-device copy in the training step blocks the host; pass `non_blocking=True`"


def _env(extra: dict | None = None) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("GPULINT_") and k not in ("NO_COLOR", "FORCE_COLOR", "GITHUB_WORKSPACE")}
    environment["PYTHONPATH"] = str(REPO) + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(extra or {})
    return environment


def gpulint(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulint", *args], cwd=cwd, capture_output=True, text=True,
                          env=_env(env), timeout=300)


def gpulint_on_terminal(*args: str, cwd: Path, env: dict | None = None, stdout_tty: bool = True,
                        stderr_tty: bool = True) -> tuple[bytes, bytes]:
    """Run with stdout and/or stderr on a pseudo-terminal; returns (terminal bytes, piped bytes)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulint", *args], cwd=cwd, env=_env({"TERM": "xterm-256color", **(env or {})}),
        stdin=subprocess.DEVNULL, stdout=slave if stdout_tty else subprocess.PIPE,
        stderr=slave if stderr_tty else subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    piped = (process.stdout or process.stderr).read() if not (stdout_tty and stderr_tty) else b""
    process.wait(timeout=300)
    return b"".join(chunks), piped


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(BAD)
    return tmp_path


# -- JSON ----------------------------------------------------------------------------------------------------

def test_json_is_shaped_like_ruffs(project):
    result = gpulint("check", "--select", "GPU011", "--output-format", "json", cwd=project)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert len(data) == 1
    item = data[0]
    assert {"cell", "code", "message", "url", "filename", "location", "end_location", "noqa_row", "fix"} <= set(item)
    assert item["code"] == "GPU011" and item["name"] == "h2d-copy-blocking" and item["message"] == MESSAGE
    assert item["filename"] == str((project / "train.py").resolve())
    assert item["relative_filename"] == "train.py"
    assert item["location"] == {"row": 6, "column": 13} and item["end_location"] == {"row": 6, "column": 25}
    assert item["noqa_row"] == 6 and item["cell"] is None
    assert item["fix"] == {"applicability": "safe", "message": "Add `non_blocking=True`", "edits": [
        {"content": "x.to(device, non_blocking=True)", "location": {"row": 6, "column": 13},
         "end_location": {"row": 6, "column": 25}}]}
    lines = gpulint("check", "--select", "GPU011", "--output-format", "json-lines", cwd=project).stdout
    assert [json.loads(line) for line in lines.splitlines()] == data
    clean = gpulint("check", "--select", "GPU022", "--output-format", "json", cwd=project)
    assert clean.returncode == 0 and json.loads(clean.stdout) == []


def test_json_noqa_row_of_a_multiline_statement(project):
    (project / "train.py").write_text(MULTILINE)
    data = json.loads(gpulint("check", "--select", "GPU011", "--output-format", "json", cwd=project).stdout)
    assert [(d["location"]["row"], d["end_location"]["row"], d["noqa_row"]) for d in data] == [(6, 8, 6)]


# -- GitHub Actions ------------------------------------------------------------------------------------------

def test_github_annotation_line_is_exact(project):
    result = gpulint("check", "--select", "GPU011", "--output-format", "github", cwd=project)
    assert result.returncode == 1
    assert result.stdout == (
        "::warning title=gpulint (GPU011),file=train.py,line=6,col=13,endLine=6,endColumn=25::"
        f"train.py:6:13: GPU011 {MESSAGE}%0A  help: Add `non_blocking=True`\n")


def test_github_paths_are_workspace_relative_and_escaped(tmp_path):
    odd = tmp_path / "src" / "a,b" / "c:d%.py"
    odd.parent.mkdir(parents=True)
    odd.write_text(BAD)
    result = gpulint("check", "--select", "GPU011", "--output-format", "github", "src", cwd=tmp_path,
                     env={"GITHUB_WORKSPACE": str(tmp_path.parent)})
    line = result.stdout.strip()
    assert f",file={tmp_path.name}/src/a%2Cb/c%3Ad%25.py,line=6," in line
    assert "::src/a,b/c:d%25.py:6:13: GPU011 " in line  # message: only %, CR and LF are escaped
    assert "./" not in line


def test_github_multiline_span_has_no_columns(project):
    (project / "train.py").write_text(MULTILINE)
    line = gpulint("check", "--select", "GPU011", "--output-format", "github", cwd=project).stdout
    assert line.startswith("::warning title=gpulint (GPU011),file=train.py,line=6,endLine=8::train.py:6:15: ")


def test_github_notes_the_annotation_cap(project):
    names = [f"x{i}" for i in range(12)]
    body = "".join(f"        {n} = {n}.to(device)\n" for n in names)
    (project / "train.py").write_text(
        f"def train(model, loader, optimizer, device):\n    for {', '.join(names)} in loader:\n{body}"
        "        loss = model(x0).sum()\n        loss.backward()\n        optimizer.step()\n")
    lines = gpulint("check", "--select", "GPU011", "--output-format", "github", cwd=project).stdout.splitlines()
    assert len(lines) == 13 and all(l.startswith("::warning ") for l in lines[:12])
    assert lines[-1].startswith("::notice title=gpulint::12 findings in total")


def test_github_escaping_functions():
    from gpulint.reporters.machine import escape_data, escape_property

    assert escape_data("50% done\r\nnext: a,b") == "50%25 done%0D%0Anext: a,b"
    assert escape_property("C:\\x,y%\n") == "C%3A\\x%2Cy%25%0A"


# -- SARIF ---------------------------------------------------------------------------------------------------

def _validator():
    import jsonschema  # from the test extra

    schema = json.loads(SCHEMA.read_text())
    assert schema["id"].endswith("sarif-schema-2.1.0.json")  # the published OASIS schema
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_sarif_validates_against_the_published_schema(project):
    (project / "broken.py").write_text("def f(:\n    pass\n")
    (project / "stale.py").write_text("import torch  # noqa: GPU011\n")
    result = gpulint("check", "--output-format", "sarif", cwd=project)
    assert result.returncode == 1
    log = json.loads(result.stdout)
    validator = _validator()
    errors = sorted(validator.iter_errors(log), key=str)
    assert not errors, errors[0].message
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    from gpulint.registry import all_rules

    assert {r.code for r in all_rules() if r.default_enabled} <= set(ids), "every enabled rule is listed"
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"] and rule["help"]["text"]
        assert rule["help"]["markdown"] and rule["name"]
        assert rule["defaultConfiguration"]["level"] in ("note", "warning", "error")
    by_rule = {r["ruleId"]: r for r in run["results"]}
    assert {"GPU011", "GPU900", "GPU902"} <= set(by_rule)
    for result_ in run["results"]:
        assert ids[result_["ruleIndex"]] == result_["ruleId"]
    gpu011 = by_rule["GPU011"]
    location = gpu011["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "train.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 6, "startColumn": 13, "endLine": 6, "endColumn": 25}
    replacement = gpu011["fixes"][0]["artifactChanges"][0]["replacements"][0]
    assert replacement["insertedContent"]["text"] == "x.to(device, non_blocking=True)"
    assert "non_blocking=True" in rules[ids.index("GPU011")]["help"]["markdown"]


def test_the_schema_check_catches_a_broken_log(project):
    log = json.loads(gpulint("check", "--select", "GPU011", "--output-format", "sarif", cwd=project).stdout)
    validator = _validator()
    for mutate in (lambda l: l.pop("version"),
                   lambda l: l["runs"][0]["results"][0].update(level="fatal"),
                   lambda l: l["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"].update(
                       startLine=0)):
        broken = copy.deepcopy(log)
        mutate(broken)
        assert list(validator.iter_errors(broken))


# -- statistics, output files, formats from the environment --------------------------------------------------

def test_statistics(project):
    text = gpulint("check", "--select", "GPU011", "--statistics", cwd=project)
    assert text.returncode == 1
    assert text.stdout == "1\tGPU011\t[*] h2d-copy-blocking\n"
    data = json.loads(gpulint("check", "--select", "GPU011", "--statistics", "--output-format", "json",
                              cwd=project).stdout)
    assert data == [{"code": "GPU011", "name": "h2d-copy-blocking", "count": 1, "fixable": True,
                     "fixable_count": 1}]


def test_output_file_and_environment(project):
    result = gpulint("check", "--select", "GPU011", "-o", "report.json", cwd=project,
                     env={"GPULINT_OUTPUT_FORMAT": "json"})
    assert result.returncode == 1 and result.stdout == ""
    assert json.loads((project / "report.json").read_text())[0]["code"] == "GPU011"
    result = gpulint("check", "--select", "GPU011", "--output-format", "sarif", cwd=project,
                     env={"GPULINT_OUTPUT_FILE": "out.sarif"})
    assert result.stdout == "" and json.loads((project / "out.sarif").read_text())["version"] == "2.1.0"


def test_machine_formats_are_never_wrapped_or_marked_up(tmp_path):
    deep = tmp_path / "[bold]x" / ("long_directory_name_" * 8)
    deep.mkdir(parents=True)
    (deep / "train.py").write_text(BAD)
    shown = f"[bold]x/{'long_directory_name_' * 8}/train.py"
    for fmt in ("github", "concise", "json", "sarif"):
        result = gpulint("check", "--select", "GPU011", "--output-format", fmt, cwd=tmp_path,
                         env={"FORCE_COLOR": "1", "COLUMNS": "40"})
        # SARIF URIs are percent-encoded (RFC 3986 has no `[` `]` in paths): the text is kept, not marked up
        assert (shown.replace("[", "%5B").replace("]", "%5D") if fmt == "sarif" else shown) in result.stdout, fmt
        if fmt != "concise":
            assert "\x1b[" not in result.stdout, fmt
    github = gpulint("check", "--select", "GPU011", "--output-format", "github", cwd=tmp_path).stdout
    assert len(github.splitlines()) == 1 and len(github) > 200


# -- colour and progress only on a terminal ------------------------------------------------------------------

def test_colour_only_on_a_terminal(project):
    piped = gpulint("check", "--select", "GPU011", cwd=project)
    assert "\x1b[" not in piped.stdout
    terminal, _ = gpulint_on_terminal("check", "--select", "GPU011", cwd=project)
    assert b"\x1b[" in terminal and b"GPU011" in terminal
    no_color, _ = gpulint_on_terminal("check", "--select", "GPU011", cwd=project, env={"NO_COLOR": "1"})
    assert b"\x1b[" not in no_color and b"GPU011" in no_color
    never, _ = gpulint_on_terminal("check", "--select", "GPU011", "--color", "never", cwd=project)
    assert b"\x1b[" not in never
    always = gpulint("check", "--select", "GPU011", "--color", "always", cwd=project)
    assert "\x1b[" in always.stdout


def test_progress_bar_only_on_long_terminal_runs(tmp_path):
    for index in range(25):
        (tmp_path / f"train_{index:02d}.py").write_text(BAD)
    terminal, _ = gpulint_on_terminal("check", "--select", "GPU011", "--output-format", "concise", cwd=tmp_path)
    assert b"checking" in terminal, terminal[-500:]
    quiet, _ = gpulint_on_terminal("check", "--select", "GPU011", "-q", cwd=tmp_path)
    assert b"checking" not in quiet
    piped = gpulint("check", "--select", "GPU011", "--output-format", "concise", cwd=tmp_path)
    assert "checking" not in piped.stderr and "\x1b[" not in piped.stderr
    # machine formats: no bar even when stderr is a terminal, and the payload stays clean
    terminal, payload = gpulint_on_terminal("check", "--select", "GPU011", "--output-format", "json",
                                            cwd=tmp_path, stdout_tty=False)
    assert b"checking" not in terminal
    assert len(json.loads(payload)) == 25
    short, _ = gpulint_on_terminal("check", "--select", "GPU011", "train_00.py", cwd=tmp_path)
    assert b"checking" not in short


# -- baselines -----------------------------------------------------------------------------------------------

def test_baseline_hides_old_findings_and_survives_edits(tmp_path):
    project = tmp_path / "repo"
    project.mkdir()
    (project / "train.py").write_text(BAD)
    (project / "other.py").write_text(BAD)
    written = gpulint("check", "--select", "GPU011", "--write-baseline", ".gpulint-baseline.json", cwd=project)
    assert written.returncode == 0, written.stderr
    assert "Wrote 2 findings to the baseline" in written.stderr
    data = json.loads((project / ".gpulint-baseline.json").read_text())
    assert sorted(f["path"] for f in data["findings"]) == ["other.py", "train.py"]
    clean = gpulint("check", "--select", "GPU011", "--baseline", ".gpulint-baseline.json", cwd=project)
    assert clean.returncode == 0, clean.stdout
    assert "2 findings hidden by the baseline." in clean.stdout
    # unrelated edits: lines inserted above, the finding re-indented into a function
    shifted = "# a new header comment\nimport os\n\n" + BAD.replace("    for x, y in loader:",
                                                                     "    print('start')\n    for x, y in loader:")
    (project / "train.py").write_text(shifted)
    assert gpulint("check", "--select", "GPU011", "--baseline", ".gpulint-baseline.json",
                   cwd=project).returncode == 0
    # from another working directory, the baseline's paths still resolve (they are relative to the file)
    assert gpulint("check", "--select", "GPU011", "--baseline", "repo/.gpulint-baseline.json", "repo",
                   cwd=tmp_path).returncode == 0
    # a new finding fails, and only it is reported
    (project / "train.py").write_text(shifted.replace("optimizer.step()", "optimizer.step()\n        y = y.cuda()"))
    result = gpulint("check", "--select", "GPU011", "--baseline", ".gpulint-baseline.json",
                     "--output-format", "concise", "-q", cwd=project)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [f"train.py:14:13: GPU011 [*] {MESSAGE}"]


def test_baseline_counts_repeated_identical_lines(project):
    twice = BAD.replace("x = x.to(device)\n", "z = x.to(device)\n        z = x.to(device)\n")
    (project / "train.py").write_text(twice)
    gpulint("check", "--select", "GPU011", "--write-baseline", "b.json", cwd=project)
    (project / "train.py").write_text(twice.replace("z = x.to(device)\n", "z = x.to(device)\n" * 2, 1))
    result = gpulint("check", "--select", "GPU011", "--baseline", "b.json", "--output-format", "concise", "-q",
                     cwd=project)
    assert result.returncode == 1 and len(result.stdout.splitlines()) == 1  # the third identical copy is new


def test_bad_baseline_is_a_usage_error(project):
    (project / "b.json").write_text("[]")
    result = gpulint("check", "--baseline", "b.json", cwd=project)
    assert result.returncode == 2 and "not a gpulint baseline" in result.stderr
    assert gpulint("check", "--baseline", "missing.json", cwd=project).returncode == 2


# -- text: fix previews --------------------------------------------------------------------------------------

def _preview(source: str, edits: tuple) -> list[str]:
    from gpulint.diagnostics import Diagnostic, Fix, Position, Safety, Severity
    from gpulint.reporters.text import Writer, render_full

    fix = Fix("Fix it", Safety.SAFE, edits)
    finding = Diagnostic("train.py", Position(1, 1), Position(1, 2), "GPU011", "name", "message", Severity.WARNING, fix)
    stream = io.StringIO()
    render_full(Writer(stream), [finding], lambda d: True, {"train.py": source})
    lines = stream.getvalue().splitlines()
    return lines[lines.index("help: Fix it") + 1:-1]


def test_fix_preview_shows_each_changed_line_with_one_line_of_context():
    from gpulint.diagnostics import Edit, Position

    # repeated lines around the edits: a preview that mis-aligned the old and new text would show other lines
    source = "".join(f"x = x.to(d)\ny{i} = {i}\n" for i in range(40))
    edits = (Edit(Position(11, 10), Position(11, 11), "d, non_blocking=True"),
             Edit(Position(61, 10), Position(61, 11), "d, non_blocking=True"))
    assert _preview(source, edits) == [
        "10 | y4 = 4",
        "   - x = x.to(d)",
        "11 + x = x.to(d, non_blocking=True)",
        "12 | y5 = 5",
        "60 | y29 = 29",
        "   - x = x.to(d)",
        "61 + x = x.to(d, non_blocking=True)",
        "62 | y30 = 30",
    ]


def test_fix_preview_of_inserted_lines_at_the_start_and_end_of_a_file():
    from gpulint.diagnostics import Edit, Position

    source = "import torch\nmodel = Net()\n"
    assert _preview(source, (Edit(Position(1, 1), Position(1, 1), "import os\n"),)) == [
        "1 + import os", "1 | import torch"]  # context lines keep their number in the file as it is
    assert _preview(source, (Edit(Position(3, 1), Position(3, 1), "model.cuda()\n"),)) == [
        "2 | model = Net()", "3 + model.cuda()"]
