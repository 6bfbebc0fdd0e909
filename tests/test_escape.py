"""String literals in generated build files, checked by the real tools: g++ and cmake."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from benanza.escape import c_string, cmake_quoted
from benanza.generator import template_env
from benanza.resources import runtime_dir

HOSTILE = ["/home/josé/venv é/bin/python3", "metric 🚀 sm__inst", 'quote " and \\ backslash', "trigraph ??= ??/",
           "octal \u00e91 then digits 777", "tab\tnewline\nend", "${HOME} $ENV{PATH} @VAR@ ; semi", "[/] [link=x]"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_c_string_literals_compile_to_the_exact_utf8_bytes(tmp_path):
    src = tmp_path / "t.cpp"
    src.write_text("#include <cstdio>\nconst char* const kS[] = {\n" + ",\n".join(c_string(s) for s in HOSTILE)
                   + "};\nint main() { for (const char* s : kS) { for (const char* p = s; *p; ++p) "
                   "std::printf(\"%02x\", (unsigned char)*p); std::printf(\"\\n\"); } }\n")
    exe = tmp_path / "t"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out == [s.encode().hex() for s in HOSTILE]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_generated_cmake_python_path_reads_back_exactly(tmp_path):
    """The cuDNN project's BENANZA_PYTHON line, evaluated by cmake itself."""
    for i, path in enumerate(HOSTILE):
        text = template_env("cudnn").get_template("CMakeLists.txt.j2").render(
            sources=[], python=path, cupti=False, variant_count=0, layer_count=0)
        (line,) = [ln for ln in text.splitlines() if ln.startswith("set(BENANZA_PYTHON")]
        script = tmp_path / f"s{i}.cmake"
        out = tmp_path / f"out{i}"
        # the same set() as a plain variable (a CACHE set needs a project), then written back raw
        script.write_text(line.rsplit(" CACHE FILEPATH", 1)[0] + ")\n"
                          + f'file(WRITE {cmake_quoted(str(out))} "${{BENANZA_PYTHON}}")\n')
        done = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == path.encode(), path


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_generated_cupti_registry_with_an_emoji_metric_compiles(tmp_path):
    metrics = ["sm__cycles 🚀", "dram é", 'q"\\']
    text = template_env("cudnn").get_template("registry.cpp.j2").render(
        functions=[], cupti_metrics=metrics, variant_count=0, layer_count=0)
    src = tmp_path / "registry.cpp"
    src.write_text(text + "\n#include <cstdio>\nint main() { for (size_t i = 0; i < benanza::cudnn::kCuptiMetricCount;"
                   " ++i) std::puts(benanza::cudnn::kCuptiMetrics[i]); }\n")
    exe = tmp_path / "r"
    done = subprocess.run(["g++", "-std=c++17", "-I", str(runtime_dir() / "cudnn"), "-I", str(runtime_dir() / "common"),
                           "-o", str(exe), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    out = subprocess.run([str(exe)], check=True, capture_output=True).stdout
    assert out == b"".join(m.encode() + b"\n" for m in metrics)
