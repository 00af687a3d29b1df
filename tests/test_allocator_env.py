"""The CUDA allocator's expandable segments (trainer/launch/argv.py ``allocator_env``): set for the workers the
supervisor starts and written into the exported Linux launch scripts, never over a value the user set, never on
Windows (PyTorch's Windows builds have none); a CPU config's scripts leave it out."""
from __future__ import annotations

import subprocess

from helpers_train import tiny_config

from trainer import config as C
from trainer.launch import argv, export_scripts

VAR, VALUE = "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"


def test_workers_get_expandable_segments_unless_the_user_set_the_variable():
    assert argv.allocator_env({}, platform="linux") == {VAR: VALUE}
    assert argv.allocator_env({VAR: "max_split_size_mb:128"}, platform="linux") == {}
    assert argv.allocator_env({}, platform="win32") == {} and argv.allocator_env({}, platform="darwin") == {}
    env = argv.worker_env({"PATH": "/bin", "RANK": "3"})
    assert env.get(VAR) == argv.allocator_env({}).get(VAR) and "RANK" not in env
    assert argv.worker_env({VAR: "garbage_collection_threshold:0.6"})[VAR] == "garbage_collection_threshold:0.6"


def test_launch_scripts_export_it_for_gpu_runs_and_keep_a_value_already_set(tmp_path):
    gpu = C.validate(tiny_config(device="cuda"))
    texts = export_scripts.launch_texts(gpu)
    for name in ("launch.sh", "launch_multi_gpu.sh", "launch_multi_node.sh"):
        assert f'export {VAR}="${{{VAR}:-{VALUE}}}"' in texts[name], name
    assert f"set {VAR}" not in texts["launch.bat"] and "no expandable segments" in texts["launch.bat"]
    assert VAR not in export_scripts.launch_texts(C.validate(tiny_config(device="cpu")))["launch.sh"]
    line = next(x for x in texts["launch.sh"].splitlines() if x.startswith("export"))
    for before, after in (("", VALUE), (f"export {VAR}=mine; ", "mine")):
        out = subprocess.run(["bash", "-c", f"set -u; {before}{line}; echo \"${VAR}\""], capture_output=True, text=True)
        assert out.stdout.strip() == after
