"""Development sessions. ``python3 -m nox`` runs the default ones (what CI runs).

Each framework plugin has one ``tests-<framework>`` session, at the lowest supported and the
latest release of its framework, each in a virtualenv holding only that framework.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tarfile
import zipfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CORE = "packages/ce-core"
TEST_DEPS = ["pytest>=8", "pytest-asyncio>=0.23", "hypothesis>=6.100"]
TIKTOKEN_CACHE = ROOT.parent / "shared" / "data" / "tiktoken-cache"

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = [
    "lint",
    "typecheck",
    "tests-core",
    "tests-langchain",
    "tests-llamaindex",
    "tests-autogen",
    "tests-semantic-kernel",
    "tests-haystack",
    "tests-crewai",
    "tests-mixed",
    "tests-view",
    "docs",
    "build",
]


def _env() -> dict[str, str]:
    env = {"PYTHONHASHSEED": "0"}
    if TIKTOKEN_CACHE.is_dir():
        env["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)
    return env


@nox.session
def lint(session: nox.Session) -> None:
    """ruff format --check and ruff check over the whole tree."""
    session.install("ruff>=0.6")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on ce.core (each plugin is checked in its framework's latest
    ``tests-<framework>`` session, beside the framework it imports)."""
    session.install(
        "mypy>=1.10", "types-regex", "-e", f"{CORE}[testing,tiktoken,cli,postgres,otel]"
    )
    session.run("mypy", "packages/ce-core/src/ce/core")


@nox.session(name="tests-core")
def tests_core(session: nox.Session) -> None:
    """Unit, property and store-contract tests of ce.core (no framework installed)."""
    session.install(
        *TEST_DEPS, "-e", f"{CORE}[tiktoken,cli,postgres,otel]", "opentelemetry-sdk>=1.27"
    )
    session.run("pytest", "tests/core", *session.posargs, env=_env())


LANGCHAIN = "packages/ce-langchain"
LANGCHAIN_VERSIONS = {
    "lowest": [
        "langchain-core==1.0.0",
        "langchain==1.0.0",
        "langchain-openai==1.0.0",
        "langgraph==1.0.0",
        "langgraph-checkpoint>=2.1.0,<3.0.0",
    ],
    "latest": ["langchain-core>=1.0,<2", "langchain>=1.0,<2", "langchain-openai>=1.0,<2"],
}


def _typecheck_plugin(session: nox.Session, package: str) -> None:
    """mypy --strict on a plugin's package, against the framework release installed in the
    session's virtualenv (run in the latest one's)."""
    session.install("mypy>=1.10", "types-regex")
    source = Path(package) / "src"
    modules = sorted(p for p in (source / "ce").iterdir() if (p / "__init__.py").is_file())
    session.run("mypy", *map(str, modules), env={"MYPYPATH": str(source)})


@nox.session(name="tests-langchain")
@nox.parametrize("langchain", list(LANGCHAIN_VERSIONS))
def tests_langchain(session: nox.Session, langchain: str) -> None:
    """ce-langchain against the real LangChain (create_agent, ChatOpenAI on the scripted
    server), in its own virtualenv."""
    session.install(
        *TEST_DEPS,
        "-e",
        f"{CORE}[tiktoken]",
        "-e",
        LANGCHAIN,
        *LANGCHAIN_VERSIONS[langchain],
        # the standard ChatModelUnitTests of wrap(); 1.0.x still allows langchain-core 1.0.0
        "langchain-tests>=1.0,<2",
    )
    session.run("pytest", "tests/langchain", *session.posargs, env=_env())
    if langchain == "latest":
        _typecheck_plugin(session, LANGCHAIN)


LLAMAINDEX = "packages/ce-llamaindex"
LLAMAINDEX_VERSIONS = {
    # llama-index-llms-openai 0.6+ imports types that llama-index-core 0.14.0 lacks
    "lowest": [
        "llama-index-core==0.14.0",
        "llama-index-workflows==2.0.0",
        "llama-index-llms-openai==0.5.6",
    ],
    "latest": ["llama-index-core>=0.14,<0.15", "llama-index-llms-openai>=0.5.6,<1"],
}


@nox.session(name="tests-llamaindex")
@nox.parametrize("llamaindex", list(LLAMAINDEX_VERSIONS))
def tests_llamaindex(session: nox.Session, llamaindex: str) -> None:
    """ce-llamaindex against the real LlamaIndex (FunctionAgent, chat engines, OpenAI on the
    scripted server), in its own virtualenv."""
    session.install(
        *TEST_DEPS,
        "-e",
        f"{CORE}[tiktoken]",
        "-e",
        LLAMAINDEX,
        *LLAMAINDEX_VERSIONS[llamaindex],
    )
    session.run("pytest", "tests/llamaindex", *session.posargs, env=_env())
    if llamaindex == "latest":
        _typecheck_plugin(session, LLAMAINDEX)


AUTOGEN = "packages/ce-autogen"
AUTOGEN_VERSIONS = {
    "lowest": ["autogen-agentchat==0.7.0", "autogen-core==0.7.0", "autogen-ext[openai]==0.7.0"],
    "latest": ["autogen-agentchat>=0.7,<0.8", "autogen-ext[openai]>=0.7,<0.8"],
}


@nox.session(name="tests-autogen")
@nox.parametrize("autogen", list(AUTOGEN_VERSIONS))
def tests_autogen(session: nox.Session, autogen: str) -> None:
    """ce-autogen against the real AutoGen (AssistantAgent, teams,
    OpenAIChatCompletionClient on the scripted server), in its own virtualenv."""
    session.install(
        *TEST_DEPS, "-e", f"{CORE}[tiktoken]", "-e", AUTOGEN, *AUTOGEN_VERSIONS[autogen]
    )
    session.run("pytest", "tests/autogen", *session.posargs, env=_env())
    if autogen == "latest":
        _typecheck_plugin(session, AUTOGEN)


SEMANTIC_KERNEL = "packages/ce-semantic-kernel"
SEMANTIC_KERNEL_VERSIONS = {
    # 1.35 imports httpx itself; openai 3 no longer brings it: the openai of its time
    "lowest": ["semantic-kernel==1.35.0", "openai>=1.60,<2"],
    "latest": ["semantic-kernel>=1.35,<2"],
}


@nox.session(name="tests-semantic-kernel")
@nox.parametrize("semantic_kernel", list(SEMANTIC_KERNEL_VERSIONS))
def tests_semantic_kernel(session: nox.Session, semantic_kernel: str) -> None:
    """ce-semantic-kernel against the real Semantic Kernel (kernels, ChatCompletionAgent,
    OpenAIChatCompletion on the scripted server), in its own virtualenv."""
    session.install(
        *TEST_DEPS,
        "-e",
        f"{CORE}[tiktoken]",
        "-e",
        SEMANTIC_KERNEL,
        *SEMANTIC_KERNEL_VERSIONS[semantic_kernel],
        # semantic_kernel.agents.orchestration (its runtime) imports protobuf: 1.35 declares it,
        # the latest 1.x (1.45) no longer does
        "protobuf",
    )
    session.run("pytest", "tests/semantic_kernel", *session.posargs, env=_env())
    if semantic_kernel == "latest":
        _typecheck_plugin(session, SEMANTIC_KERNEL)


HAYSTACK = "packages/ce-haystack"
HAYSTACK_VERSIONS = {
    # 3.0: the first release whose Agent runs after_tool hooks (tool calls are recorded there)
    "lowest": ["haystack-ai==3.0.0"],
    "latest": ["haystack-ai>=3.0,<4"],
}


@nox.session(name="tests-haystack")
@nox.parametrize("haystack", list(HAYSTACK_VERSIONS))
def tests_haystack(session: nox.Session, haystack: str) -> None:
    """ce-haystack against the real Haystack (Pipelines, Agents, OpenAIChatGenerator on the
    scripted server), in its own virtualenv."""
    session.install(
        *TEST_DEPS, "-e", f"{CORE}[tiktoken]", "-e", HAYSTACK, *HAYSTACK_VERSIONS[haystack]
    )
    session.run(
        "pytest",
        "tests/haystack",
        *session.posargs,
        env={**_env(), "HAYSTACK_TELEMETRY_ENABLED": "False"},
    )
    if haystack == "latest":
        _typecheck_plugin(session, HAYSTACK)


CREWAI = "packages/ce-crewai"
CREWAI_VERSIONS = {
    "lowest": ["crewai==1.15.0"],  # keep equal to ce.crewai.package.LOWEST
    "latest": ["crewai>=1.15,<2"],
}


@nox.session(name="tests-crewai")
@nox.parametrize("crewai", list(CREWAI_VERSIONS))
def tests_crewai(session: nox.Session, crewai: str) -> None:
    """ce-crewai against the real CrewAI (crews, agents, tasks and its OpenAI provider on the
    scripted server), in its own virtualenv, telemetry and tracing off."""
    session.install(*TEST_DEPS, "-e", f"{CORE}[tiktoken]", "-e", CREWAI, *CREWAI_VERSIONS[crewai])
    env = _env() | {
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_TRACING_ENABLED": "false",
        "OTEL_SDK_DISABLED": "true",
    }
    session.run("pytest", "tests/crewai", *session.posargs, env=env)
    if crewai == "latest":
        _typecheck_plugin(session, CREWAI)


@nox.session(name="tests-mixed")
def tests_mixed(session: nox.Session) -> None:
    """One session shared by a LangChain agent and a LlamaIndex agent
    (examples/mixed_runtime.py), both frameworks at their latest, in one virtualenv."""
    session.install(
        *TEST_DEPS,
        "-e",
        f"{CORE}[tiktoken]",
        "-e",
        LANGCHAIN,
        "-e",
        LLAMAINDEX,
        *LANGCHAIN_VERSIONS["latest"],
        *LLAMAINDEX_VERSIONS["latest"],
    )
    session.run("pytest", "tests/mixed", *session.posargs, env=_env())


BROWSER_PACKAGES = ("chromium", "chromium-driver")


def _install_browser(session: nox.Session) -> None:
    """Debian's chromium and its WebDriver, when missing and apt-get may run (as root); the
    browser test skips, saying why, when they still are not there."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.warn("no chromium/chromedriver and no root apt-get: the browser test skips")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, success_codes=[0, 100], env=env)
    session.run(
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        *BROWSER_PACKAGES,
        external=True,
        success_codes=[0, 100],
        env=env,
    )


@nox.session(name="tests-view")
def tests_view(session: nox.Session) -> None:
    """``ce view``: its JSON API over a stored demo session, and the page in headless
    Chromium driven by Selenium (installed here when missing; the test skips without it)."""
    _install_browser(session)
    session.install(*TEST_DEPS, "selenium>=4.10", "-e", f"{CORE}[tiktoken]")
    session.run("pytest", "tests/view", *session.posargs, env=_env())


@nox.session
def demo(session: nox.Session) -> None:
    """The README's demo: a LangChain agent through ``ce.langchain.install(...)`` on the
    embedded default store (SQLite under ./.ce/), offline; ``examples/core_demo.py`` is the
    ce.core one (``python examples/core_demo.py``)."""
    session.install(
        "-e",
        f"{CORE}[tiktoken,cli]",
        "-e",
        LANGCHAIN,
        *LANGCHAIN_VERSIONS["latest"],
    )
    session.run("python", "examples/quickstart.py", *session.posargs, env=_env())


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs.yml) into site/; any warning fails the build."""
    session.install("mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10")
    env = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", "--clean", *session.posargs, env=env)


PACKAGES = {  # folder -> import package folder inside the wheel
    CORE: "ce/core",
    LANGCHAIN: "ce/langchain",
    LLAMAINDEX: "ce/llamaindex",
    AUTOGEN: "ce/autogen",
    SEMANTIC_KERNEL: "ce/semantic_kernel",
    HAYSTACK: "ce/haystack",
    CREWAI: "ce/crewai",
}


def _check_dists(dist: Path, folder: str, package: str) -> Path:
    """The wheel of ``folder`` in ``dist`` after checking that it and the sdist hold the
    package, its py.typed, README and LICENSE, and no ``ce/__init__.py`` (a namespace)."""
    name = Path(folder).name.replace("-", "_")
    (wheel,) = dist.glob(f"{name}-*.whl")
    (sdist,) = dist.glob(f"{name}-*.tar.gz")
    with zipfile.ZipFile(wheel) as zipped:
        names = set(zipped.namelist())
    missing = [f for f in (f"{package}/__init__.py", f"{package}/py.typed") if f not in names]
    if "ce/__init__.py" in names:
        missing.append("no ce/__init__.py (a namespace package)")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        missing.append("LICENSE in .dist-info/licenses")
    with tarfile.open(sdist) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing += [
        f"{f} in the sdist"
        for f in ("README.md", "LICENSE", "pyproject.toml", f"src/{package}/py.typed")
        if f not in inside
    ]
    if missing:
        raise RuntimeError(f"{wheel.name} / {sdist.name}: missing {', '.join(missing)}")
    return wheel


@nox.session(reuse_venv=False)
def build(session: nox.Session) -> None:
    """Build the sdist and wheel of every package, check what they hold, install the wheels
    (not editable) in this fresh virtualenv, then run the demo from them and every command it
    prints."""
    session.install("uv>=0.4")
    dist = Path(session.create_tmp()).resolve() / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for folder in PACKAGES:
        if (ROOT / folder / "LICENSE").read_bytes() != (ROOT / "LICENSE").read_bytes():
            session.error(f"{folder}/LICENSE differs from the repository's LICENSE")
        session.run("uv", "build", "--quiet", "--out-dir", str(dist), folder)
    wheels = {folder: _check_dists(dist, folder, pkg) for folder, pkg in PACKAGES.items()}
    core = wheels.pop(CORE)
    session.install(
        f"ce-core[tiktoken,cli] @ {core.as_uri()}",
        *(str(w) for w in wheels.values()),
        *LANGCHAIN_VERSIONS["latest"],
    )
    session.run("python", "-c", "import ce.core, ce.langchain, ce.crewai, ce.haystack")
    out = session.run("python", "examples/quickstart.py", env=_env(), silent=True)
    print(out)
    printed = (out or "").partition("see them again from the store")[2].splitlines()[1:]
    commands = [shlex.split(line) for line in printed if line.startswith("    ")]
    if not commands:
        raise RuntimeError("the demo printed no ce command to run")
    for command in commands:
        session.run(*command, env=_env(), external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks and write their figures into docs/benchmarks.md.

    bench_prepare.py compares ``prepare_turn`` with the frameworks' own trimmers, and
    bench_langchain.py / bench_llamaindex.py measure the LangChain / LlamaIndex plugins, so
    this session's virtualenv (and only this one) holds the frameworks; bench_workers.py needs
    psycopg for its PostgreSQL runs.
    """
    session.install(
        "-e",
        f"{CORE}[tiktoken,postgres]",
        "-e",
        LANGCHAIN,
        "-e",
        LLAMAINDEX,
        "-e",
        AUTOGEN,
        "tiktoken>=0.14.0",
        "langchain-core>=1.7.2,<2",
        "llama-index-core>=0.14.25,<0.15",
        "autogen-core>=0.7.5",
        "autogen-agentchat>=0.7.5",
        "semantic-kernel>=1.45.0",
        "haystack-ai>=3.4,<4",  # CompactionHook's compactors: 3.4
    )
    session.run("python", "benchmarks/bench_stores.py", "--write", "docs/benchmarks.md", env=_env())
    session.run(
        "python",
        "benchmarks/bench_prepare.py",
        "--warm-turns",
        "100",
        "--write",
        "docs/benchmarks.md",
        env=_env(),
    )
    session.run(
        "python", "benchmarks/bench_langchain.py", "--write", "docs/benchmarks.md", env=_env()
    )
    session.run(  # the same on PostgreSQL (the server of bench_workers.py below)
        "python",
        "benchmarks/bench_langchain.py",
        "--postgres",
        "postgresql://postgres@127.0.0.1:5432/test",
        "--write",
        "docs/benchmarks.md",
        env=_env(),
    )
    session.run(
        "python", "benchmarks/bench_llamaindex.py", "--write", "docs/benchmarks.md", env=_env()
    )
    session.run(
        "python", "benchmarks/bench_autogen.py", "--write", "docs/benchmarks.md", env=_env()
    )
    session.run(  # each session's agent continued with a new question a turn
        "python",
        "benchmarks/bench_autogen.py",
        "--continued",
        "--write",
        "docs/benchmarks.md",
        env=_env(),
    )
    for concurrent in (
        "benchmarks/bench_async_langchain.py",
        "benchmarks/bench_async_llamaindex.py",
    ):
        session.run("python", concurrent, "--write", "docs/benchmarks.md", env=_env())
    session.run(
        "python", "benchmarks/bench_catchup.py", "--write", "docs/benchmarks.md", env=_env()
    )
    session.run(
        "python", "benchmarks/bench_long_session.py", "--write", "docs/benchmarks.md", env=_env()
    )
    session.run(  # a regenerate and an edit against a call that continues
        "python", "benchmarks/bench_going_back.py", "--write", "docs/benchmarks.md", env=_env()
    )
    session.run(  # SQLite, and PostgreSQL when a server answers
        "python", "benchmarks/bench_deferred.py", "--write", "docs/benchmarks.md", env=_env()
    )
    # worker processes on shared sessions: SQLite, and PostgreSQL when a server answers
    session.run(
        "python", "benchmarks/bench_workers.py", "--write", "docs/benchmarks.md", env=_env()
    )


@nox.session
def schema(session: nox.Session) -> None:
    """Regenerate docs/schema/session-document.schema.json from the pydantic models."""
    session.install("-e", CORE)
    session.run("python", "-m", "ce.core.schema", "docs/schema/session-document.schema.json")


if os.environ.get("CI"):
    nox.options.error_on_missing_interpreters = True
