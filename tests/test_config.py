"""Config loading: YAML, dotted overrides, type checks, validate(), and the one-line CLI errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from annotated_transformer.config import Config, all_keys, describe
from annotated_transformer.config import (
    config_from_dict,
    config_summary,
    config_to_dict,
    config_yaml,
    load_config,
    shipped_configs,
)
from annotated_transformer.runtime.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_bare_name_and_path_load_the_same_config():
    by_name = load_config("copy")
    by_file = load_config("copy.yaml")
    by_path = load_config(str(ROOT / "configs" / "copy.yaml"))
    assert config_to_dict(by_name) == config_to_dict(by_file) == config_to_dict(by_path)
    assert by_name.name == "copy"
    assert by_name.data.dataset == "copy"
    assert by_name.model.N == 2


def test_dotted_overrides_are_typed():
    cfg = load_config("copy", ["train.epochs=2", "model.d_model=64", "train.adam_eps=1e-8",
                               "model.norm_first=false", "train.adam_betas=[0.9, 0.99]"])
    assert cfg.train.epochs == 2 and isinstance(cfg.train.epochs, int)
    assert cfg.model.d_model == 64
    assert cfg.train.adam_eps == pytest.approx(1e-8) and isinstance(cfg.train.adam_eps, float)
    assert cfg.model.norm_first is False
    assert cfg.train.adam_betas == [0.9, 0.99]


def test_unknown_key_suggests_the_closest_name():
    with pytest.raises(ConfigError, match=r"unknown config key 'model.d_modle' \(did you mean 'model.d_model'\?\)"):
        load_config("copy", ["model.d_modle=3"])
    with pytest.raises(ConfigError, match="did you mean 'train.epochs'"):
        load_config("copy", ["trian.epochs=3"])


def test_wrong_types_are_rejected():
    with pytest.raises(ConfigError, match="train.epochs must be an integer"):
        load_config("copy", ["train.epochs=two"])
    with pytest.raises(ConfigError, match="model.norm_first must be true or false"):
        load_config("copy", ["model.norm_first=1"])
    with pytest.raises(ConfigError,
                       match="model.attention_kernel must be one of 'auto', 'fused', 'explicit'; got 'flash'"):
        load_config("copy", ["model.attention=flash"])  # its name before 2026-11-25, read under the new one
    with pytest.raises(ConfigError, match="^model.N must be an integer, got true$"):  # as YAML spells it
        load_config("copy", ["model.N=true"])
    with pytest.raises(ConfigError, match=r"^token_merging.layers must be a list like \[0, 2\], got 0$"):
        load_config("copy", ["token_merging.layers=0"])  # layer numbers, not the Adam betas' example


def test_validate_checks_cross_field_rules():
    with pytest.raises(ConfigError, match=r"d_model \(100\) must be divisible by model.h \(8\)"):
        load_config("copy", ["model.d_model=100", "model.h=8"])
    with pytest.raises(ConfigError, match="dropout must be in"):
        load_config("copy", ["model.dropout=1.5"])
    cfg = Config()
    cfg.model.tie_embeddings = True
    with pytest.raises(ConfigError, match="tie_embeddings needs one vocabulary"):
        cfg.validate()


@pytest.mark.parametrize("override, message", [
    ("train.seed=-1", "train.seed must not be negative, got -1"),  # numpy's traceback before
    ("train.lr_factor=inf", "train.lr_factor must be a positive number, got inf"),  # "training diverged" before
    ("train.lr_factor=nan", "train.lr_factor must be a positive number, got nan"),
    ("train.adam_eps=0", "train.adam_eps must be a positive number"),
    ("decode.alpha=-0.5", "decode.alpha must be a number of at least 0, got -0.5"),  # evaluate refused it only
])
def test_a_value_that_cannot_train_or_decode_is_refused_up_front(override, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config("tiny", [override])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config("nope")
    message = str(err.value)  # one line; every shipped config with its purpose on a line of its own after it
    assert message == "config file 'nope' not found; give a config's name (listed below) or a path to a YAML file"
    assert err.value.details[0] == "the shipped configs:"
    assert [line.split()[0] for line in err.value.details[1:]] == list(shipped_configs())
    for line, purpose in zip(err.value.details[1:], shipped_configs().values()):
        assert line.endswith(f"  {purpose}")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  N: 2\n   d_model: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+ column \d+: invalid YAML"):
        load_config(str(bad))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(str(scalar))


def test_yaml_unknown_key_names_the_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("train:\n  epoch: 3\n")
    with pytest.raises(ConfigError,
                       match=r"x.yaml: unknown config key 'train.epoch' \(did you mean 'train.epochs'\?\)"):
        load_config(str(f))
    f.write_text("model:\n  N: 1\n  d_ff: 64\n  N: 2\n")  # YAML keeps the last silently: refused here
    with pytest.raises(ConfigError, match=r"x.yaml line 4 column 3: invalid YAML \(the key 'N' is given twice"):
        load_config(str(f))
    f.write_text("base: &small {N: 1, d_ff: 64}\nmodel:\n  <<: *small\n  N: 2\n")  # a merge's key given again:
    with pytest.raises(ConfigError, match="unknown config section 'base'"):  # allowed (the section is not)
        load_config(str(f))
    f.write_text("model:\n  <<: {N: 1, d_ff: 64}\n  N: 2\n")
    assert (load_config(str(f)).model.N, load_config(str(f)).model.d_ff) == (2, 64)
    f.write_text("trian:\n  epochs: 3\n")  # a section's name mistyped: the section meant, not one of its keys
    with pytest.raises(ConfigError, match=r"x.yaml: unknown config section 'trian' \(did you mean 'train'\?\)$"):
        load_config(str(f))


def test_round_trip_through_yaml_and_dict(tmp_path):
    cfg = load_config("copy", ["train.seed=7"])
    (tmp_path / "c.yaml").write_text(config_yaml(cfg), encoding="utf-8")
    again = load_config(str(tmp_path / "c.yaml"))
    assert config_to_dict(again) == config_to_dict(cfg)  # the saved name wins over the file stem
    assert config_to_dict(config_from_dict(config_to_dict(cfg))) == config_to_dict(cfg)


def test_every_field_has_help():
    rows = describe()
    assert {k for k, _, _ in rows} == set(all_keys())
    missing = [k for k, _, h in rows if not h.strip()]
    assert not missing, f"fields without a help text: {missing}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "copy", "model.d_modle=3"], "did you mean 'model.d_model'"),
        (["--config", "does-not-exist"], "config file 'does-not-exist' not found"),
        (["--config", "copy", "train.epochs"], "not of the form section.key=value"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(args, message, tmp_path, monkeypatch, capsys):
    from annotated_transformer.cli import run

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:  # what scripts/train.py runs, in this process
        run("train", args, "train.py")
    assert done.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # One line; a config that is not found is followed by the shipped ones to choose from, a line each.
    assert len(lines) == 1 or ("not found" in lines[0] and lines[1] == "the shipped configs:"), lines
    assert lines[0].startswith("error: ") and message in lines[0]
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_a_script_error_in_its_own_process_is_one_line_and_exit_2(tmp_path):
    """As a user runs it: one line on stderr, exit 2, no traceback from the interpreter either."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--config", "copy", "model.d_modle=3"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "did you mean 'model.d_model'" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_config_doc_is_up_to_date():
    from annotated_transformer.config import config_markdown, describe

    doc = (Path(__file__).resolve().parents[1] / "docs/config.md").read_text(encoding="utf-8")
    assert doc == config_markdown(), (
        "docs/config.md is stale: uv run python -m annotated_transformer.config > docs/config.md")
    for key, _, text in describe():
        assert f"| `{key}` |" in doc and text  # every key documented, none without a help text


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_is_valid(path):
    cfg = load_config(path.stem)
    assert cfg.name == path.stem
    purpose = config_summary(path)
    assert 20 <= len(purpose) <= 110, "every shipped config opens with a one-line comment saying what it is for"
    assert shipped_configs()[path.stem] == purpose


def test_config_help_lists_every_shipped_config_smallest_first():
    from annotated_transformer.config import CONFIG_LADDER, config_parser

    text = config_parser("x").format_help()
    shipped = shipped_configs()
    assert set(shipped) == {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    assert list(shipped)[: len(CONFIG_LADDER)] == [n for n in CONFIG_LADDER if n in shipped]
    width = max(map(len, shipped))  # one column: the longest name and two spaces
    for name, purpose in shipped.items():
        assert f"  {name:<{width}}  {purpose}" in text
    assert "docs/config.md" in text


def test_an_old_value_name_still_loads_under_its_new_name():
    from annotated_transformer.config import config_from_dict, config_to_dict, load_config

    cfg = load_config("base.yaml", ["data.batching=reference", "data.max_len=40"])  # the names before 2026-11-25
    assert cfg.data.batching == "notebook" and cfg.data.max_sentence_len == 40
    saved = config_to_dict(cfg)
    saved["data"]["batching"] = "reference"  # as an older checkpoint holds them
    saved["data"]["max_len"] = saved["data"].pop("max_sentence_len")
    again = config_from_dict(saved)
    assert again.data.batching == "notebook" and again.data.max_sentence_len == 40
    assert saved["data"]["max_len"] == 40  # the checkpoint's dict itself is left as it was
    from annotated_transformer.harness.run_dir import check_same_settings

    check_same_settings(saved, cfg, Path("runs/old"))  # an older run resumes with today's names
    # an attention dropout spelled out at model.dropout (0.3) is the model saved without the key
    check_same_settings(saved, load_config("base.yaml", ["data.batching=notebook", "data.max_sentence_len=40",
                                                         "model.attention_dropout=0.3"]), Path("runs/old"))
    with pytest.raises(ConfigError, match=r"its model settings differ \(attention_dropout\)"):
        check_same_settings(saved, load_config("base.yaml", ["data.batching=notebook", "data.max_sentence_len=40",
                                                             "model.attention_dropout=0.1"]), Path("runs/old"))
    with pytest.raises(ConfigError, match=r"its data settings differ \(max_sentence_len\)"):
        check_same_settings(saved, load_config("base.yaml", ["data.batching=notebook", "data.max_sentence_len=41"]),
                            Path("runs/old"))
    with pytest.raises(ConfigError, match="data.batching must be one of 'bucket', 'notebook'"):
        load_config("base.yaml", ["data.batching=fixed"])
    both = {"data": {"max_len": 40, "max_sentence_len": 41}}
    with pytest.raises(ConfigError, match="saved config: data.max_len and data.max_sentence_len are one setting"):
        config_from_dict(both)


def test_the_extension_keys_before_their_sections_still_load():
    """Configs, command lines and checkpoints from before 2026-11-25 name the extensions under model/objective."""
    old = {"model": {"N": 2, "h": 4, "attention": "naive", "local_window": 0, "merge_ratio": 0.25, "prune_ratio": 0.0,
                     "merge_layers": [1], "proportional_attention": False},
           "objective": {"ss_rate": 0.3, "ss_schedule": "constant", "ss_start": 5, "ss_steps": 50, "ss_sample": True,
                         "guide_weight": 0.5, "guide_sigma": 0.3, "guide_layers": [0], "guide_heads": [1],
                         "guide_decay_steps": 9}}
    cfg = config_from_dict(old)
    assert cfg.model.attention_kernel == "explicit"
    assert (cfg.token_merging.merge_ratio, cfg.token_merging.layers, cfg.token_merging.proportional_attention) == (
        0.25, [1], False)
    s, g = cfg.scheduled_sampling, cfg.guided_attention
    assert (s.rate, s.schedule, s.start, s.steps, s.sample) == (0.3, "constant", 5, 50, True)
    assert (g.weight, g.sigma, g.layers, g.heads, g.decay_steps) == (0.5, 0.3, [0], [1], 9)
    assert "objective" in old and old["model"]["merge_ratio"] == 0.25  # the saved dict itself is left as it was
    line = load_config("copy.yaml", ["model.local_window=3", "objective.guide_weight=0.2", "model.attention=sdpa"])
    assert (line.local_attention.window, line.guided_attention.weight, line.model.attention_kernel) == (3, 0.2, "fused")
    with pytest.raises(ConfigError, match="model.merge_ratio and token_merging.merge_ratio are one setting"):
        config_from_dict({"model": {"merge_ratio": 0.2}, "token_merging": {"merge_ratio": 0.3}})


def test_an_older_run_resumes_only_with_the_same_model_extensions():
    from annotated_transformer.harness.run_dir import check_same_settings

    saved = config_to_dict(load_config("copy.yaml"))
    saved["model"]["local_window"] = saved.pop("local_attention")["window"]  # as a run from before the sections
    check_same_settings(saved, load_config("copy.yaml"), Path("runs/old"))
    with pytest.raises(ConfigError, match=r"its local_attention settings differ \(window\)"):
        check_same_settings(saved, load_config("copy.yaml", ["local_attention.window=2"]), Path("runs/old"))
    with pytest.raises(ConfigError, match=r"its token_merging settings differ \(merge_ratio\)"):
        check_same_settings(saved, load_config("copy.yaml", ["token_merging.merge_ratio=0.2"]), Path("runs/old"))
