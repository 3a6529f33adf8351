"""The workspace verbs as a new user meets them: init, config show, doctor, --debug, --help."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lumos.cli.app import app

runner = CliRunner()


def test_init_then_config_show_reflects_the_file_and_overrides(tmp_path):
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    config_file = tmp_path / "lumos.toml"
    config_file.write_text(config_file.read_text().replace('master = "local[*]"', 'master = "local[2]"'))
    result = runner.invoke(app, ["--workspace", str(tmp_path), "config", "show", "--json", "--set", "spark.shuffle_partitions=3"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["config_file"] == str(config_file)
    assert shown["settings"]["spark"]["master"] == "local[2]"
    assert shown["settings"]["spark"]["shuffle_partitions"] == 3
    assert shown["workspace_root"] == str(tmp_path / ".lumos")


def test_init_writes_into_the_workspace_option_when_no_folder_is_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["--workspace", "project", "init"]).exit_code == 0
    assert (tmp_path / "project" / "lumos.toml").is_file() and not (tmp_path / "lumos.toml").exists()


def test_bad_lumos_toml_names_file_and_keys(tmp_path):
    (tmp_path / "lumos.toml").write_text('[spark]\nmaster = 3\nshufle_partitions = 2\n[mlflw]\n')
    result = runner.invoke(app, ["--workspace", str(tmp_path), "config", "show"])
    assert result.exit_code == 2
    assert f"{tmp_path / 'lumos.toml'}: 3 problems" in result.stderr
    assert "spark.master: expected a string, got integer 3" in result.stderr
    assert "spark.shufle_partitions: unknown key (did you mean 'shuffle_partitions'?)" in result.stderr
    assert "mlflw: unknown key (did you mean 'mlflow'?)" in result.stderr
    assert "Traceback" not in result.output
    debug = runner.invoke(app, ["--debug", "--workspace", str(tmp_path), "config", "show"])
    assert debug.exit_code == 2 and "Traceback" in debug.stderr


def test_doctor_passes_on_this_machine(spark, tmp_path):
    result = runner.invoke(app, ["--workspace", str(tmp_path), "doctor", "--json"])
    report = json.loads(result.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert set(checks) == {"java", "spark+delta", "mlflow", "c compiler", "cuda compiler", "gpu"}
    assert all(checks[name]["ok"] for name in ("java", "spark+delta", "mlflow", "c compiler")), checks
    assert report["ok"] is True and result.exit_code == 0
    assert (tmp_path / ".lumos" / "mlflow.db").is_file()


def test_help_teaches_every_verb():
    result = runner.invoke(app, ["--help"])
    for verb in ("init", "doctor", "ingest", "config", "data"):
        assert verb in result.stdout
    assert "--recipe" in runner.invoke(app, ["ingest", "--help"]).stdout
