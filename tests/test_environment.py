"""training/scoring.py `environment`: what results.json records that a rerun must match to the digit."""

import os

from stackft_jax.training import scoring

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Example 1234
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile
processor\t: 1
model name\t: another line of a second core, not read
flags\t\t: fpu
"""


def test_the_host_cpu_is_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    assert scoring._host_cpu(cpuinfo) == {
        "cpu_model": "Intel(R) Xeon(R) Example 1234",
        "cpu_vector_extensions": ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile"],
    }
    assert scoring._host_cpu(tmp_path / "absent") == {"cpu_model": "", "cpu_vector_extensions": []}


def test_the_environment_names_versions_threads_and_cpu():
    env = scoring.environment()
    assert env["platform"] == "cpu" and env["jax"] and env["jaxlib"]
    assert env["cpu_threads"] == len(os.sched_getaffinity(0))
    assert set(env["cpu_vector_extensions"]) <= set(scoring.VECTOR_EXTENSIONS)
    assert env["xla_flags"] == os.environ.get("XLA_FLAGS", "")
