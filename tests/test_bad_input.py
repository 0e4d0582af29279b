"""Bad input never crashes a run: each case is a one-line finding or message naming the file, the other files
are still checked, exit codes stay right, and nothing is damaged."""

import subprocess
import sys

import pytest

GOOD = "import torch\nfor x, y in loader:\n    x = x.to('cuda')\n    x.sum().backward()\n    opt.step()\n"


def gpulint(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gpulint", *args, "--select", "GPU011", "--output-format", "concise", "--no-cache"],
                          capture_output=True, text=True, cwd=cwd)


CASES = {
    "syntax_error.py": (b"def f(:\n    pass\n", "GPU900"),
    "python2.py": (b'print "hello"\n', "GPU900"),
    "undecodable.py": (b"x = '\xff\xfe\xfa'\n", "GPU901"),
    "binary.py": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "GPU901"),
    "bad_cookie.py": (b"# -*- coding: klingon -*-\nx = 1\n", "GPU901"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_is_one_line_finding_and_run_continues(tmp_path, name):
    content, code = CASES[name]
    (tmp_path / name).write_bytes(content)
    (tmp_path / "train.py").write_text(GOOD)
    result = gpulint("check", ".", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stdout.splitlines() if name in line]
    assert len(lines) == 1 and code in lines[0], result.stdout
    assert "GPU011" in result.stdout  # the good file was still checked
    assert "Traceback" not in result.stdout + result.stderr
    fixed = gpulint("fix", "--apply", ".", cwd=tmp_path)
    assert (tmp_path / name).read_bytes() == content  # never touched
    assert "Traceback" not in fixed.stdout + fixed.stderr


@pytest.mark.parametrize(("name", "content"), [
    ("latin1.py", "# -*- coding: latin-1 -*-\n# café\n" + GOOD),
    ("bom.py", "\ufeff" + GOOD),
    ("crlf.py", GOOD.replace("\n", "\r\n")),
    ("tabs.py", GOOD.replace("    ", "\t")),
])
def test_odd_but_valid_files_are_linted(tmp_path, name, content):
    encoding = "latin-1" if "latin" in name else "utf-8"
    (tmp_path / name).write_bytes(content.encode(encoding))
    result = gpulint("check", name, cwd=tmp_path)
    line = content.lstrip("\ufeff").splitlines().index(GOOD.splitlines()[2].replace("    ", "\t" if "tabs" in name
                                                                                         else "    ")) + 1
    assert result.returncode == 1 and f"{name}:{line}:" in result.stdout, result.stdout + result.stderr


def test_empty_file_is_clean(tmp_path):
    (tmp_path / "empty.py").write_bytes(b"")
    result = gpulint("check", "empty.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_missing_path_is_reported_and_others_checked(tmp_path):
    (tmp_path / "train.py").write_text(GOOD)
    result = gpulint("check", "nope.py", "train.py", cwd=tmp_path)
    assert "nope.py" in result.stdout + result.stderr and "GPU011" in result.stdout
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_unreadable_file(tmp_path):
    (tmp_path / "dangling.py").symlink_to(tmp_path / "does-not-exist.py")
    (tmp_path / "train.py").write_text(GOOD)
    result = gpulint("check", ".", cwd=tmp_path)
    line = [ln for ln in result.stdout.splitlines() if "dangling.py" in ln]
    assert len(line) == 1 and "GPU901" in line[0], result.stdout
    assert "GPU011" in result.stdout and "Traceback" not in result.stderr


def test_directory_symlink_loop_terminates(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(GOOD)
    (tmp_path / "pkg" / "loop").symlink_to(tmp_path / "pkg")
    result = gpulint("check", ".", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout.count("GPU011") == 1, result.stdout


def test_huge_file(tmp_path):
    body = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(20000))
    (tmp_path / "huge.py").write_text("import torch\n" + body + GOOD)
    result = gpulint("check", "huge.py", cwd=tmp_path)
    assert result.returncode == 1 and "GPU011" in result.stdout


def test_read_only_file_is_not_written(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(GOOD)
    path.chmod(0o444)
    result = gpulint("fix", "--apply", "train.py", cwd=tmp_path)
    assert path.read_text() == GOOD
    assert "train.py" in result.stderr and "read-only" in result.stderr
    assert result.returncode == 1
