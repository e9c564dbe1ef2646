"""The fastest inference precision and XLA setting per machine
(deep_nmt_tf.hardware.fastest_inference_settings) and the tools' use of it
(deep_nmt_tf.cli.inference_settings), with faked CPU flags."""

import json
import logging

import pytest

from deep_nmt_tf import cli, hardware
from deep_nmt_tf.hardware import cpu_flags, fastest_inference_settings


def _cpuinfo(flags, vendor="GenuineIntel", model_name="Intel(R) Xeon(R) Platinum 8480+"):
    block = (f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel\t\t: 143\n"
             f"model name\t: {model_name}\nflags\t\t: {flags}\n\n")
    return block.format(0) + block.format(1)


SAPPHIRE_RAPIDS = _cpuinfo("fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile")
ZEN4 = _cpuinfo("fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16", "AuthenticAMD",
                "AMD EPYC 9654")
SKYLAKE = _cpuinfo("fpu sse2 avx avx2 fma avx512f avx512bw")
ZEN3 = _cpuinfo("fpu sse2 avx avx2 fma", "AuthenticAMD", "AMD EPYC 7B13")
GRAVITON = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd sve bf16 i8mm\n\n"


def test_cpu_flags_of_the_first_processor():
    assert {"avx512_bf16", "amx_bf16", "avx2"} <= cpu_flags(SAPPHIRE_RAPIDS)
    assert "avx512f" not in cpu_flags(ZEN3)
    assert {"sve", "bf16"} <= cpu_flags(GRAVITON)
    assert cpu_flags("") == frozenset()


@pytest.mark.parametrize("cpuinfo,precision,jit_compile,named", [
    (SAPPHIRE_RAPIDS, "bfloat16", False, "with amx_bf16, avx512_bf16"),
    (ZEN4, "bfloat16", False, "with avx512_bf16"),
    (SKYLAKE, "float32", True, "without amx_bf16 or avx512_bf16"),
    (ZEN3, "float32", True, "without amx_bf16 or avx512_bf16"),
    (GRAVITON, "float32", True, "without"),  # ARM's bf16 is not oneDNN's x86 path
])
def test_the_cpu_decides_precision_and_xla(cpuinfo, precision, jit_compile, named):
    settings = fastest_inference_settings(cpuinfo=cpuinfo, accelerator=False)
    assert (settings.precision, settings.jit_compile) == (precision, jit_compile)
    assert named in settings.reason
    assert settings.reason.startswith(f"{precision} {'with' if jit_compile else 'without'} XLA")


def test_a_gpu_gets_float32_with_xla():
    settings = fastest_inference_settings(cpuinfo=SAPPHIRE_RAPIDS, accelerator=True)
    assert (settings.precision, settings.jit_compile) == ("float32", True)
    assert "GPU" in settings.reason


def test_flags_given_override_the_choice():
    """A precision given keeps its value and gets the XLA setting that suits it here; an XLA
    setting given is kept."""
    f32 = fastest_inference_settings("float32", cpuinfo=SAPPHIRE_RAPIDS, accelerator=False)
    assert (f32.precision, f32.jit_compile) == ("float32", True)
    assert "--precision=float32 given" in f32.reason
    bf16 = fastest_inference_settings("bfloat16", cpuinfo=ZEN3, accelerator=False)
    assert (bf16.precision, bf16.jit_compile) == ("bfloat16", False)
    forced = fastest_inference_settings(None, True, cpuinfo=SAPPHIRE_RAPIDS, accelerator=False)
    assert (forced.precision, forced.jit_compile) == ("bfloat16", True)
    assert "--jit_compile given" in forced.reason
    both = fastest_inference_settings("float16", False, cpuinfo=ZEN3, accelerator=True)
    assert (both.precision, both.jit_compile) == ("float16", False)


@pytest.mark.parametrize("speedup,precision,jit_compile", [
    (1.88, "bfloat16", False),  # The Zen 4's 2048² matmul (BENCHMARKS.md).
    (0.56, "float32", True),  # An Intel Xeon listing avx512_bf16 without AMX.
    (1.2, "bfloat16", False),
])
def test_bfloat16_flags_alone_do_not_decide(speedup, precision, jit_compile):
    """A CPU whose bfloat16 matmul is measured slower than float32's gets float32, whatever
    its flags say; the reason names the measurement."""
    settings = fastest_inference_settings(cpuinfo=ZEN4, accelerator=False, bf16_speedup=speedup)
    assert (settings.precision, settings.jit_compile) == (precision, jit_compile)
    assert f"{speedup:.2f}x float32's" in settings.reason and "avx512_bf16" in settings.reason
    given = fastest_inference_settings("bfloat16", cpuinfo=ZEN4, accelerator=False,
                                       bf16_speedup=speedup)
    assert (given.precision, given.jit_compile) == ("bfloat16", False)


def test_the_bfloat16_speedup_is_measured_once_per_cpu(monkeypatch, tmp_path, caplog):
    calls = []

    def rates():
        calls.append(1)
        return 200.0, 112.0

    monkeypatch.setattr(hardware, "_matmul_rates", rates)
    hardware.bfloat16_matmul_speedup.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="absl"):
            assert hardware.bfloat16_matmul_speedup(str(tmp_path)) == pytest.approx(0.56)
        assert any("0.56x" in r.getMessage() for r in caplog.records)
        hardware.bfloat16_matmul_speedup.cache_clear()  # A later process reads the file.
        assert hardware.bfloat16_matmul_speedup(str(tmp_path)) == pytest.approx(0.56)
        assert len(calls) == 1
        kept = json.loads((tmp_path / "bfloat16_speedup.json").read_text())
        entry = kept[hardware.cpu_feature_key()]
        assert (entry["float32_gflops"], entry["bfloat16_gflops"]) == (200.0, 112.0)
        assert entry["measured"] and entry["cpu"]
        # Another CPU's entry is kept beside this one's; a damaged file is measured over.
        kept["0123456789abcdef"] = {"speedup": 2.5}
        (tmp_path / "bfloat16_speedup.json").write_text(json.dumps(kept))
        hardware.bfloat16_matmul_speedup.cache_clear()
        assert hardware.bfloat16_matmul_speedup(str(tmp_path)) == pytest.approx(0.56)
        assert len(calls) == 1
        (tmp_path / "bfloat16_speedup.json").write_text("{not json")
        hardware.bfloat16_matmul_speedup.cache_clear()
        assert hardware.bfloat16_matmul_speedup(str(tmp_path)) == pytest.approx(0.56)
        assert len(calls) == 2
        # A cache that cannot be written costs a measurement each time, not a failure.
        blocked = tmp_path / "a_file"
        blocked.write_text("")
        hardware.bfloat16_matmul_speedup.cache_clear()
        with caplog.at_level(logging.WARNING, logger="absl"):
            assert hardware.bfloat16_matmul_speedup(str(blocked)) == pytest.approx(0.56)
        assert any("Could not keep" in r.getMessage() for r in caplog.records)
    finally:
        hardware.bfloat16_matmul_speedup.cache_clear()


def test_the_matmul_rates_are_measured():
    float32, bfloat16 = hardware._matmul_rates(size=64, repeats=2, inner=2)
    assert 0 < float32 < 1e6 and 0 < bfloat16 < 1e6


@pytest.mark.parametrize("speedup,chosen", [(1.9, ("bfloat16", False)),
                                            (0.56, ("float32", True))])
def test_the_tools_measure_this_machine(monkeypatch, speedup, chosen):
    monkeypatch.setattr(hardware, "_this_cpu_flags", lambda: cpu_flags(ZEN4))
    monkeypatch.setattr(hardware, "_has_accelerator", lambda: False)
    monkeypatch.setattr(hardware, "bfloat16_matmul_speedup", lambda: speedup)
    assert cli.inference_settings(None, None)[:2] == chosen


def test_the_tools_log_the_choice_once(monkeypatch, caplog):
    monkeypatch.setattr(hardware, "_this_cpu_flags", lambda: cpu_flags(ZEN4))
    monkeypatch.setattr(hardware, "bfloat16_matmul_speedup", lambda: 1.9)
    monkeypatch.setattr(hardware, "_has_accelerator", lambda: False)
    with caplog.at_level(logging.INFO, logger="absl"):
        assert cli.inference_settings(None, None)[:2] == ("bfloat16", False)
    lines = [r.getMessage() for r in caplog.records if "Inference settings" in r.getMessage()]
    assert len(lines) == 1 and "avx512_bf16" in lines[0] and "override" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="absl"):
        assert cli.inference_settings("float32", False)[:2] == ("float32", False)
    assert not [r for r in caplog.records if "Inference settings" in r.getMessage()]


def test_the_library_default_follows_the_same_rule(monkeypatch):
    from deep_nmt_tf.export.module import default_jit_compile

    monkeypatch.setattr(hardware, "_has_accelerator", lambda: False)
    assert default_jit_compile("float32") and default_jit_compile("float16")
    assert not default_jit_compile("bfloat16")
    monkeypatch.setattr(hardware, "_has_accelerator", lambda: True)
    assert default_jit_compile("bfloat16")


def test_the_suite_keeps_its_measurements_out_of_the_users_cache():
    """tests/conftest.py points the package's caches at a directory of this test run (a
    measurement taken under the suite's load must not be what the user's tools read)."""
    import os

    from deep_nmt_tf import hardware

    home = os.path.realpath(hardware.cache_home())
    assert home.startswith(os.path.realpath(os.environ["DEEP_NMT_TEST_CACHE_HOME"]))
    assert not home.startswith(os.path.realpath(os.path.expanduser("~/.cache")))
