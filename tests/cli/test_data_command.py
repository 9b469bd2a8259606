"""``moe-data prepare``'s command line: a summary on success, problems on stderr and exit 2."""

from __future__ import annotations

import subprocess
import sys

from moe_cdk.cli.data import main as data_main


def test_cli_missing_input_exits_2_with_a_formatted_message(tmp_path, capsys):
    missing = tmp_path / "absent.txt"
    code = data_main(["prepare", "--input", str(missing), "--output-prefix", str(tmp_path / "out")])
    assert code == 2
    assert (
        capsys.readouterr().err
        == f"moe-data prepare: 1 problem(s)\n  input: no such file (got '{missing}'; allowed an existing file)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_prepare_prints_a_summary(tmp_path, capsys):
    source = tmp_path / "corpus.txt"
    source.write_text("one\n\ntwo\n")
    assert data_main(["prepare", "--input", str(source), "--output-prefix", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out == f"prepared 2 documents, 8 tokens: {tmp_path}/c.bin {tmp_path}/c.idx\n"


def test_cli_prepare_shows_progress_on_stderr(tmp_path, capsys):
    source = tmp_path / "corpus.txt"
    source.write_text("one\n\ntwo\n")
    assert data_main(["prepare", "--input", str(source), "--output-prefix", str(tmp_path / "c"), "--workers", "2"]) == 0
    assert capsys.readouterr().err.startswith("moe-data prepare: 100% 0.0/0.0 MiB ")


def test_cli_does_not_import_torch_before_it_prepares():
    # `moe-data --help` took 3.5 s, nearly all of it importing torch.
    code = "import sys, moe_cdk.cli.data; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
