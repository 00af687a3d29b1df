"""One home per rule, checked on the sources so a second copy cannot come back silently (issue 40): the picture
geometry (kinds, defaults, the masked families, the image-token lookup), whether llama.cpp is installed and its
pinned version, the hub cache's folder layout, the GSM8K pattern and the prompt shapes, the three format detectors'
distinct names, the two chat-template rules, T5's module, the structure record's format, the benchmarks without an
import circle, the secret redaction, config validation; and no dead names or stale paths in the tree.

Each check reads the files as text or syntax (no imports of the heavy rooms): milliseconds."""
from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

from trainer.core.paths import PROCESSORS_DIR, hf_repo_cache
from trainer.models import gguf_support, image_caps, structure, vision

REPO = Path(__file__).resolve().parent.parent
ROOMS = ("trainer", "app")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


@functools.lru_cache(maxsize=None)
def _sources(rooms=ROOMS) -> dict[str, str]:
    """{path relative to the repository: text} of the Python files under ``rooms``."""
    return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in _tracked(*(f"{r}/*.py" for r in rooms))}


@functools.lru_cache(maxsize=None)
def _tree(path: str) -> ast.Module:
    return ast.parse(_sources_text(path))


def _sources_text(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def _where(pattern: str, rooms=ROOMS) -> set[str]:
    """The files under ``rooms`` whose text matches ``pattern`` (a regular expression)."""
    rx = re.compile(pattern)
    return {path for path, text in _sources(rooms).items() if rx.search(text)}


def _defined(name: str, rooms=ROOMS) -> set[str]:
    """The files under ``rooms`` that define ``name`` (a function, class or module-level assignment)."""
    return _definitions(rooms).get(name, set())


@functools.lru_cache(maxsize=None)
def _definitions(rooms) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in _sources(rooms):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.setdefault(node.name, set()).add(path)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, set()).add(path)
    return out


# -- the picture vocabulary ---------------------------------------------------------------------------------------
def test_one_picture_vocabulary_for_the_planner_and_the_worker():
    assert _where(r"image_processor_type") <= {"trainer/models/vision.py"}, "processors are classified in vision.py"
    assert _where(r"56 \* 56|28 \* 28 \* 1280|\b364\b(?!\.)", ("trainer",)) <= {"trainer/models/vision.py"}, \
        "the processors' defaults are vision.py's"
    assert _defined("MASKED_WITH_PICTURES") == {"trainer/models/vision.py"}
    assert _defined("FORMAT", ("trainer",)) == {"trainer/models/structure.py"}, "the structure record's format"
    assert _where(r"image_token_index") == {"trainer/worker/datapipe/vision_inputs.py"}, "one image-token lookup"
    assert not _where(r"_as_processor_config"), "no processor config is faked to pass between the two"


@pytest.mark.parametrize("name", sorted(p.stem for p in PROCESSORS_DIR.glob("*.json")))
@pytest.mark.parametrize("cap", [None, 200_704, 1_003_520])
def test_the_planner_and_the_worker_cap_a_shipped_processor_alike(name, cap):
    """The planner's settings of a catalog model (read by family) and the worker's (read from the processor's own
    config) are capped to the same sizes and words."""
    record = json.loads((PROCESSORS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    model = json.loads((PROCESSORS_DIR.parent / f"{name}.json").read_text(encoding="utf-8"))
    planned = image_caps.capped(vision.for_model(model, None, name), cap)
    worker = image_caps.capped(vision.from_processor_config({**record["preprocessor"], **record["processor"]}), cap)
    assert planned.kind == worker.kind
    assert (planned.min_pixels, planned.max_pixels, planned.longest_edge, planned.tile, planned.cap_words) == \
        (worker.min_pixels, worker.max_pixels, worker.longest_edge, worker.tile, worker.cap_words)


def test_the_kinds_of_families_and_processors_are_one_set():
    kinds = {vision.kind_of_family(f) for f in vision.FAMILIES}
    assert kinds == {vision.kind_of_processor(pre) for pre in (
        {"image_processor_type": "Qwen2VLImageProcessor"}, {"image_processor_type": "Idefics3ImageProcessor"},
        {"image_processor_type": "SiglipImageProcessor"})} == {"dynamic", "tiles", "fixed"}


# -- llama.cpp ----------------------------------------------------------------------------------------------------
def test_whether_llama_cpp_is_installed_is_asked_of_capabilities_only():
    assert not _where(r"find_spec\(\s*[\"']llama_cpp"), "ask trainer.core.capabilities.installed('llama-cpp-python')"
    assert not _where(r"metadata\.version\(\s*[\"']llama-cpp-python"), "capabilities.package(...).version"


PIN_READERS = {  # files that cannot import the pin (shell, PowerShell, package metadata, the test builder whose
    # source is hashed into its cache's name): this test ties them to it
    "installers/linux/dev-setup.sh", "installers/linux/install.sh", "installers/windows/install.ps1", ".ci/run",
    "pyproject.toml", "tests/real_models.py"}


def test_the_llama_cpp_pin_has_one_home():
    pin = gguf_support.LLAMA_CPP_PYTHON
    versions = re.compile(r"llama[-_]cpp[-_]python(?:==|-|\s+)(\d+\.\d+\.\d+)|SDIST_VERSION = \"(\d+\.\d+\.\d+)\"")
    seen = {}
    for path in _tracked():
        if path.suffix in (".json", ".txt", ".gguf") or "fixtures" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for m in versions.finditer(text):
            seen.setdefault(str(path.relative_to(REPO)), set()).add(m.group(1) or m.group(2))
    other = {p: v for p, v in seen.items() if v != {pin}}
    assert not other, f"the pinned llama-cpp-python is {pin} (trainer/models/gguf_support.py): {other}"
    named = {p for p in seen if not p.endswith(".md") and p not in ("trainer/models/gguf_support.py",)}
    assert named <= PIN_READERS, \
        f"Python reads gguf_support.LLAMA_CPP_PYTHON instead of writing the version: {sorted(named - PIN_READERS)}"
    fetch = (REPO / "installers" / "fetch_llama_cpp.py").read_text(encoding="utf-8")
    assert "pinned_version()" in fetch and pin not in fetch


# -- small rules --------------------------------------------------------------------------------------------------
def test_the_hub_cache_layout_is_written_once(tmp_path, monkeypatch):
    assert _where(r"[\"']models--") == {"trainer/core/paths.py"}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert hf_repo_cache(" org/name ") == tmp_path / "models--org--name"


def test_the_gsm8k_pattern_and_the_prompt_shapes_live_in_prompts():
    assert _where(r"re\.compile\(r?[\"']####") == {"trainer/data/prompts.py"}
    assert _defined("PROMPT_SHAPES") == {"trainer/data/prompts.py"}


@pytest.mark.parametrize("name, home", [
    ("file_format_of", "trainer/data/readers.py"), ("record_format_of", "trainer/data/formats.py"),
    ("webhook_format_of", "trainer/supervisor/notify.py"), ("set_chat_template", "trainer/worker/datapipe/rendering.py"),
    ("template_or_run_rendering", "trainer/worker/generate/generation.py"), ("redact", "trainer/core/secrets.py"),
    ("hf_repo_cache", "trainer/core/paths.py"), ("config_image_token", "trainer/worker/datapipe/vision_inputs.py"),
    ("Seq2SeqCollator", "trainer/worker/train/seq2seq.py"), ("fixed_size", "trainer/models/vision.py"),
])
def test_each_rule_is_defined_in_its_one_home(name, home):
    assert _defined(name) == {home}


def test_names_that_meant_two_things_are_gone():
    assert not _defined("detect_format") and not _defined("ensure_chat_template")


def test_redaction_and_validation_are_asked_not_rewritten():
    assert _where(r"TOKEN_PATTERN\.sub") == {"trainer/core/secrets.py"}, "use trainer.core.secrets.redact"
    assert _where(r"\bRunConfig\.model_validate\(") <= {"trainer/config/loading.py"}, "use trainer.config.validate"


def test_the_benchmarks_import_no_circle():
    scripts = {p.stem: p for p in (REPO / "benchmarks").glob("*.py")}
    edges = {}
    for name, path in scripts.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        found |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        edges[name] = found & set(scripts) - {name}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges[start])

    assert not [n for n in edges if reaches(n, n)]


# -- dead names and stale paths -----------------------------------------------------------------------------------
def _is_framework_hook(node, parent) -> bool:
    """A name the framework calls, never the code: a pydantic validator, a Qt override (camelCase method), a
    transformers callback event (on_*)."""
    if any("validator" in ast.unparse(d) for d in getattr(node, "decorator_list", ())):
        return True
    return isinstance(parent, ast.ClassDef) and (node.name != node.name.lower() or node.name.startswith("on_"))


# Module-level names another module reaches by name at run time, not by an import.
CALLED_BY_NAME = {"register": "trainer/cli/main.py calls module.register(sub) for each command module"}


def _module_word(path: str) -> str:
    p = Path(path)
    return p.parent.name if p.name == "__init__.py" else p.stem


@functools.lru_cache(maxsize=None)
def _imports() -> tuple[dict, dict]:
    """({(module's last word, name): {files importing it by name}}, {file: {alias: module's last word}})."""
    by_name: dict[tuple[str, str], set[str]] = {}
    aliases: dict[str, dict[str, str]] = {}
    for path, text in _sources(("trainer", "app", "benchmarks", "tools", "installers", "tests")).items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    by_name.setdefault((node.module.split(".")[-1], a.name), set()).add(path)
                    if a.asname:
                        aliases.setdefault(path, {})[a.asname] = a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        aliases.setdefault(path, {})[a.asname] = a.name.split(".")[-1]
    return by_name, aliases


def _named_elsewhere(path: str, name: str, texts: dict[str, str]) -> bool:
    """Whether a file other than ``path`` names module ``path``'s ``name``: imports it (``from … mod import name``)
    or reaches it through the module (``mod.name``, ``alias.name``, ``mod:name`` in an entry point)."""
    module = _module_word(path)
    by_name, aliases = _imports()
    if by_name.get((module, name), set()) - {path}:
        return True
    for other, text in texts.items():
        if other == path or name not in text:
            continue
        words = [module] + [a for a, m in aliases.get(other, {}).items() if m == module]
        if re.search(rf"\b(?:{'|'.join(map(re.escape, words))})[.:]{re.escape(name)}\b", text):
            return True
    return False


def test_every_name_defined_in_the_tree_is_used():
    """A module-level name counts as used only where its own module names it again or another file names it
    through that module (a word count over the whole tree let ``_MISSING`` and ``SETUPS`` hide behind their
    namesakes in other modules); a method or nested name, reached through objects, where the word recurs anywhere."""
    texts: dict[str, str] = {}
    words: dict[str, int] = {}
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts[str(path.relative_to(REPO))] = text
        for w in re.findall(r"[A-Za-z_]\w*", text):
            words[w] = words.get(w, 0) + 1
    dead = []
    for path in _sources(("trainer", "app", "benchmarks", "tools", "installers")):
        tree = _tree(path)
        own = re.findall(r"[A-Za-z_]\w*", texts[path])
        for parent in ast.walk(tree):
            for node in ast.iter_child_nodes(parent):
                names = [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and not _is_framework_hook(node, parent) else []
                if isinstance(node, ast.Assign) and parent is tree:
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                for n in names:
                    if n.startswith("__") or n == "main":
                        continue
                    if parent is tree:
                        used = own.count(n) > 1 or n in CALLED_BY_NAME or _named_elsewhere(path, n, texts)
                    else:
                        used = words.get(n, 0) > 1
                    if not used:
                        dead.append(f"{path}:{node.lineno} {n}")
    assert not dead, f"defined and never named again: {dead}"


PATH = re.compile(r"(?<![\w/.~$-])((?:trainer|app|tests|docs|benchmarks|installers|tools|configs|\.ci)/[\w./-]*\w)")
NOT_OURS = {"tests/test-tokenizer-0": "llama.cpp's own test file format",
            "trainer/worker.py": "a fixture run's traceback from an old version (what the GUI shows of a crash)",
            "trainer/configs": "where configs/ lies inside an installed wheel (setup.py maps it there)",
            "tests/test_x.py": "the README's example of a test file",
            "docs/design": "a regular expression for docs/design.md citations (tests/test_design_doc.py)"}


def test_every_path_the_tree_names_exists():
    stale = []
    for path in _tracked():
        rel = str(path.relative_to(REPO))
        if path.suffix in (".json", ".jsonl", ".gguf", ".png", ".svg") or rel.startswith("trainer/resources/"):
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(lines, 1):
            for m in PATH.finditer(line):
                named = m.group(1).rstrip(".")  # a trailing "_" is a prefix: tests/test_<what>.py
                module = named.split(".")[0]  # tests/helpers_arch.lora_config: a module's attribute
                if named.endswith((".json", "_")) or named in NOT_OURS or (REPO / named).exists() or \
                        (REPO / f"{module}.py").exists() or (REPO / named).with_suffix(".py").exists():
                    continue
                stale.append(f"{rel}:{i}: {named}")
    assert not stale, f"paths that no longer exist: {stale}"
