"""The architecture, checked rather than hoped (README "Developer notes").

- import-linter's contracts (pyproject.toml): trainer's rooms are layered
  (cli ▸ supervisor | worker ▸ launch ▸ planning ▸ models | data ▸ rundir | hardware ▸ config ▸ core),
  only the worker room imports the training libraries, the GUI never imports the worker or the CLI,
  and trainer never imports the GUI;
- no import cycle between modules, and no import inside a function that only hides one (the only
  imports of trainer modules inside functions are lazy imports of the heavy worker room);
- the contracts really catch a torch import outside the worker room (a planted one fails them).
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = 7


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          capture_output=True, text=True, cwd=root, env=env, timeout=300)


def test_import_linter_contracts_hold():
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Contracts: {CONTRACTS} kept, 0 broken" in proc.stdout


def _copy_tree(tmp_path):
    for item in ("app", "trainer", "pyproject.toml"):
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, tmp_path / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, tmp_path / item)


def _planted(tmp_path, lines: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the tree with ``lines`` ({file: an import}) planted at the top of those files."""
    _copy_tree(tmp_path)
    for rel, line in lines.items():
        path = tmp_path / rel
        path.write_text(f"{line}  # planted by the test\n" + path.read_text())
    proc = _lint(tmp_path)
    assert proc.returncode != 0, proc.stdout
    return proc


def test_a_torch_import_outside_the_worker_room_breaks_the_contracts(tmp_path):
    proc = _planted(tmp_path, {"trainer/planning/memory.py": "import torch"})
    assert "only the worker room imports the training libraries BROKEN" in proc.stdout
    assert "trainer.planning.memory -> torch" in proc.stdout


def test_the_kernel_gguf_and_weight_file_libraries_are_the_worker_rooms_too(tmp_path):
    """liger_kernel, triton, llama_cpp and safetensors are training-side libraries like torch: planted outside the
    worker room (one each, in one lint), every one is named."""
    planted = {"liger_kernel": "trainer/planning/loss_kernel.py", "triton": "trainer/models/spec.py",
               "llama_cpp": "trainer/models/gguf_support.py", "safetensors": "trainer/cli/main.py"}
    proc = _planted(tmp_path, {rel: f"import {module}" for module, rel in planted.items()})
    assert "only the worker room imports the training libraries BROKEN" in proc.stdout
    for module, rel in planted.items():
        assert f"{rel[:-3].replace('/', '.')} -> {module}" in proc.stdout, (module, proc.stdout[-3000:])


def test_a_qt_import_in_the_app_model_breaks_the_contracts(tmp_path):
    """app.model is the Qt-free layer (as napari keeps Qt out of its models): a planted import fails."""
    proc = _planted(tmp_path, {"app/model/fmt.py": "from PySide6 import QtCore"})
    assert "the app's model layer is Qt-free BROKEN" in proc.stdout


def test_a_worker_sub_room_importing_upwards_breaks_the_contracts(tmp_path):
    proc = _planted(tmp_path, {"trainer/worker/datapipe/pipeline.py": "from trainer.worker.train import recipe"})
    assert "the worker's sub-rooms are layered BROKEN" in proc.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in graph.modules or w.split(".")[0] not in ("app", "trainer"):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m.split(".")[0] in ("app", "trainer") and m not in index:
            visit(m)
    return out


def test_no_import_cycles_between_modules():
    graph = grimp.build_graph("app", "trainer")
    assert _cycles(graph) == []


HEAVY = ("torch", "transformers", "peft", "deepspeed", "datasets", "accelerate", "trl", "tokenizers", "numpy",
         "pyqtgraph")


def _type_checking_blocks(tree) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(n) for n in ast.walk(node))
    return ids


def test_no_import_inside_a_function_except_lazy_heavy_ones():
    """An import of our own module inside a function is allowed only when that module brings in a heavy
    library (torch and friends in the worker room; numpy/pyqtgraph in the GUI, loaded after the window
    shows). Anything else belongs at the top of the module, where a cycle could not hide."""
    graph = grimp.build_graph("app", "trainer", include_external_packages=True)

    def heavy(module: str) -> bool:
        return any(h in graph.modules and graph.chain_exists(importer=module, imported=h) for h in HEAVY)

    offenders = []
    for path in sorted([*REPO.joinpath("trainer").rglob("*.py"), *REPO.joinpath("app").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed = {id(n) for n in tree.body} | _type_checking_blocks(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in allowed and node.module \
                    and node.module.split(".")[0] in ("trainer", "app"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if not any(t in graph.modules and heavy(t) for t in targets):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} from {node.module}")
    assert offenders == []


def test_light_rooms_do_not_import_torch_at_run_time():
    code = ("import sys, trainer.config, trainer.rundir.events, trainer.cli.main, trainer.supervisor.supervise, "
            "trainer.supervisor.preflight, trainer.supervisor.create, trainer.data.readers, trainer.planning.plan, "
            "trainer.planning.ladder, trainer.launch.export_scripts\n"
            "trainer.cli.main.build_parser()\n"
            "heavy = [m for m in ('torch', 'transformers', 'deepspeed', 'peft', 'datasets') if m in sys.modules]\n"
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
