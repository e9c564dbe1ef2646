"""deep-nmt-benchmark (tools/benchmark.py): a tiny training benchmark end to end, and the flags
that one mode would silently ignore are refused."""

import json

import pytest
import yaml

from test_training_helpers import run_tool
from test_training_tool import TINY


@pytest.mark.parametrize("args, message", [
    (("--mode=decode", "--override=training.precision=mixed_bfloat16"),
     "--override applies to --mode=train only"),
    (("--mode=train", "--precision=bfloat16"),
     "--precision=bfloat16 applies to --mode=decode only"),
    (("--mode=decode", "--input=x.txt", "--reference=y.txt"),
     "--input, --reference: only used with --mode=decode_file"),
    (("--mode=decode_file", "--model_dir=runs/x"),
     "--mode=decode_file needs --model_dir and --input"),
    (("--mode=decode", "--route=fit"), "--route and --skip_non_finite apply to --mode=train"),
    (("--mode=train", "--route=fit", "--unknown_shapes"),
     "--unknown_shapes applies to --route=loop"),
    (("--mode=decode", "--diagnostics"), "--diagnostics applies to --mode=train --route=loop"),
    (("--mode=pipeline",), "--mode=pipeline needs --model_dir"),
    (("--mode=pipeline", "--model_dir=runs/x", "--precision=bfloat16"),
     "--config, --precision: not used with --mode=pipeline"),
    (("--mode=train", "--model_dir=runs/x"),
     "--model_dir: only used with --mode=decode_file (--model_dir also with --mode=pipeline)"),
    (("--mode=train", "--route=fit", "--diagnostics"),
     "--diagnostics applies to --mode=train --route=loop"),
])
def test_flags_of_the_other_mode_are_refused(args, message):
    proc = run_tool("benchmark", "--config=small", *args)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert message in proc.stderr
    assert "tokens_per_s" not in proc.stdout


def test_tiny_training_benchmark_reports_its_precision_and_step(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": TINY["model"]}))  # the benchmark sets the rest
    out = tmp_path / "results.jsonl"
    proc = run_tool("benchmark", "--mode=train", f"--config={config}", "--steps=1",
                    "--repeats=1", "--warmup=1", "--override=training.precision=mixed_bfloat16",
                    "--diagnostics", f"--output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [result] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["precision"] == "mixed_bfloat16"
    assert result["diagnostics"] is True  # the grad-norm ratio's step, on every step
    assert result["tokens_per_s"] > 0 and result["step_s"] > 0
    # 64 sentences x (32 + 32) tokens per step, the peer harness's batch.
    assert result["batch"] == [64, 32, 32]
    assert result["train_flops_per_step"] > 0
    recorded = json.loads(out.read_text().splitlines()[-1])
    assert " cores, TensorFlow " in recorded.pop("machine")  # --output names the machine
    assert recorded == result


def test_step_ops_mode_counts_a_config_file(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": TINY["model"]}))
    out = tmp_path / "results.jsonl"
    proc = run_tool("benchmark", "--mode=step_ops", f"--config={config}", "--precision=bfloat16",
                    f"--output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    greedy, beam = result["step_ops"]
    assert (greedy["label"], beam["label"]) == ("greedy bfloat16", "beam4 bfloat16")
    assert 0 < greedy["total"] < beam["total"]
    assert sum(beam["by_part"].values()) == beam["total"]
    assert f"| **total** | **{greedy['total']}** | **{beam['total']}** |" in proc.stdout
    assert json.loads(out.read_text().splitlines()[-1])["step_ops"] == result["step_ops"]


def test_decode_benchmark_takes_a_config_file(tmp_path):
    """``--mode=decode --config=FILE`` (as ``configs/multi30k/deep_pre_dec1.yaml`` for the
    deep-encoder, shallow-decoder table): the file's model, random weights, the shapes asked
    for; in process (the tool adds the SavedModel, as for the presets)."""
    from deep_nmt_tf.benchmark.decoding import _config, benchmark_decode
    from deep_nmt_tf.models import build_model

    model = dict(TINY["model"], decoder={"transformer": dict(TINY["model"]["decoder"][
        "transformer"], num_layers=1)})
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": model}))
    result = benchmark_decode(config=str(config), modes=("greedy", "beam4"),
                              paths=("translator",), batch_size=3, source_length=8, steps=4,
                              vocab_size=50, repeats=1, jit_compile=False)
    built = _config(str(config), 50, 1, 4)
    assert built.model.decoder.get().num_layers == 1 and built.model.d_model == 16
    assert result["params"] == build_model(built).count_params()
    assert result["all_lengths_ok"] and result["steps"] == 4
    assert set(result["results"]["translator"]) == {"greedy", "beam4"}
    assert all(r["tokens"] == 3 * 4 for r in result["results"]["translator"].values())


@pytest.mark.parametrize("skip", [True, False], ids=["skipping", "bare Adam"])
def test_fit_route_training_benchmark_names_its_optimizer(tmp_path, skip):
    """--route=fit times compile/fit's step, with the optimizer that skips non-finite updates
    or (--noskip_non_finite) the bare Adam."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": TINY["model"]}))
    proc = run_tool("benchmark", "--mode=train", "--route=fit", f"--config={config}",
                    "--steps=1", "--repeats=1", "--warmup=1",
                    "--skip_non_finite" if skip else "--noskip_non_finite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [result] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["route"], result["backend"]) == ("fit", "tensorflow")
    assert result["optimizer"] == ("SkipNonFiniteUpdates" if skip else "Adam")
    assert result["tokens_per_s"] > 0 and result["batch"] == [64, 32, 32]
