"""The ``cogproxy`` command line: serve, run, validate, test, conformance.

Every ``serve`` flag can also be set by an environment variable (``COGPROXY_<FLAG>``); a flag
given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

# Only what building the parser needs is imported here: ``cogproxy --help`` and the light commands
# never load the server, the app or the pipeline (each command imports what it runs).
from proxy import __version__, conformance_table
from proxy.calibration import command as calibration_command
from proxy.calibration import policy_command
from proxy.observability.logbuffer import DEFAULT_FLUSH_INTERVAL_S, MAX_FLUSH_INTERVAL_S
from proxy.settings import (
    DEFAULT_CLIENT_READ_TIMEOUT_S,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_INFLIGHT_BODY_BYTES,
    DEFAULT_MAX_UPLOAD_BYTES,
    DEFAULT_POOL_SIZE,
    DEFAULT_RELOAD_INTERVAL_S,
    DEFAULT_STREAM_HEARTBEAT_S,
    DEFAULT_STREAM_SESSION_MAX_BYTES,
    DEFAULT_STREAM_SESSION_TTL_S,
    MAX_WORKERS,
    WORKER_FLAG,
)
from proxy.state.redis_defaults import DURABLE_REPLICAS, LIMITS_TIMEOUT_S
from proxy.state.redis_flags import ACCESS_FLAGS, add_refused_password_flag

if TYPE_CHECKING:
    from proxy.media.model import Media
    from proxy.module.golden import CaseOutcome, GoldenCase
    from proxy.module.model import Module
    from proxy.pipeline import ModuleAnswer
    from proxy.policy.model import Policy
    from proxy.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


OFFLINE_MODEL = "offline/examples"
OFFLINE_MEDIA_S = 30.0
"""Time an offline run gives its media step (a URL input is fetched for real, with the
default media policy)."""
"""``meta.model`` of an answer ``run``/``test`` produce without a policy (no rung, no provider)."""


def offline_envelope(module: Module, value: Any, case: GoldenCase | None = None) -> dict[str, Any]:
    """One module call answered by the offline provider: input check, answer, contract."""
    from proxy.contract.engine import run_contract
    from proxy.contract.inputs import check_input
    from proxy.media.resolve import stubbed, validation_meta
    from proxy.media.step import MediaEnv, prepare_media
    from proxy.policy.model import MediaPolicy
    from proxy.upstream.offline import offline_answer

    started = time.perf_counter()
    error = check_input(module, value, sized=stubbed if module.takes_media else None)
    media: tuple[Media, ...] = ()
    if error is None and module.takes_media:
        prepared = asyncio.run(
            prepare_media(module, value, MediaPolicy(), time.monotonic() + OFFLINE_MEDIA_S, MediaEnv())
        )
        error, media = (prepared, ()) if isinstance(prepared, dict) else (None, prepared)
    envelope = (
        error if error is not None else run_contract(offline_answer(module, value, case), module).envelope
    )
    meta = envelope.get("meta")
    if isinstance(meta, dict) and error is None:
        meta["model"] = OFFLINE_MODEL
        meta["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
        if media:
            meta["media_validation"] = validation_meta(media)
    return envelope


def _module_path_or_report(args: argparse.Namespace) -> Path | None:
    """The directory of the module the command names, or None after saying what is missing."""
    from proxy.module.loader import ModuleLoadError
    from proxy.module.locate import locate_module

    try:
        return locate_module(args.module, [Path(d) for d in args.modules])
    except ModuleLoadError as exc:
        print(exc, file=sys.stderr)
        return None


def _module_or_report(args: argparse.Namespace) -> Module | None:
    from proxy.module.loader import ModuleLoadError, load_module

    path = _module_path_or_report(args)
    if path is None:
        return None
    try:
        return load_module(path)
    except ModuleLoadError as exc:
        print(exc, file=sys.stderr)
        return None


def cmd_validate(args: argparse.Namespace) -> int:
    from proxy.module.lint import lint_module

    path = _module_path_or_report(args)
    if path is None:
        return EXIT_FAILED
    problems, warnings = lint_module(path, v22=args.v22)
    for line in [*problems, *warnings]:
        print(line)
    if not problems:
        print(f"{path}: valid" + (" (v2.2)" if args.v22 else ""))
    return EXIT_FAILED if problems else EXIT_OK


def cmd_new(args: argparse.Namespace) -> int:
    from proxy.module.scaffold import ScaffoldError, scaffold

    try:
        root = scaffold(Path(args.dir), args.name, args.tier)
    except (ScaffoldError, OSError) as exc:
        print(f"new: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"created {root}/ (module.yaml, prompt.md, schema.json, tests/example.*.json)")
    print(f"next: edit the lines marked CHANGE, then: cogproxy validate {root} --v22 && cogproxy test {root}")
    return EXIT_OK


def cmd_conformance(args: argparse.Namespace) -> int:
    from proxy.conformance import OFFICIAL_VECTORS, run_vectors

    if args.markdown or args.update_docs:
        return _conformance_table(args.update_docs)
    directory = Path(args.directory) if args.directory is not None else OFFICIAL_VECTORS
    if not directory.is_dir():
        print(f"{directory}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    outcomes = run_vectors(directory)
    failed = [o for o in outcomes if not o.passed]
    for outcome in failed:
        print(f"FAIL {outcome.path.relative_to(directory)} ({outcome.name}): {outcome.problem}")
    print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return EXIT_FAILED if failed or not outcomes else EXIT_OK


def _conformance_table(page: str | None) -> int:
    """Print the conformance table as the conformance page's section, or rewrite it in ``page``."""
    if page is None:
        print(conformance_table.markdown(), end="")
        return EXIT_OK
    path = Path(page)
    try:
        path.write_text(conformance_table.with_section(path.read_text(encoding="utf-8")), encoding="utf-8")
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{path}: conformance section regenerated")
    return EXIT_OK


def _policy_or_report(path: str) -> Policy | None:
    """The policy at ``path``, or None after printing why it was refused (path and key)."""
    from proxy.policy.loader import PolicyError, load_policy

    try:
        return load_policy(Path(path))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return None


def cmd_test(args: argparse.Namespace) -> int:
    from proxy.module.golden import run_golden
    from proxy.policy.loader import PolicyError

    module = _module_or_report(args)
    if module is None:
        return EXIT_FAILED
    if not module.tests:
        print(
            f"{module.path}: no golden tests to run: module.yaml has no tests: list and "
            f"{module.path / 'tests'} holds no *.input.json files",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if args.policy:
        policy = _policy_or_report(args.policy)
        if policy is None:
            return PolicyError.EXIT_STATUS
        outcomes = asyncio.run(_golden_with_policy(module, policy))
    else:
        outcomes = run_golden(module, offline_envelope)
    for outcome in outcomes:
        mark = "PASS" if outcome.passed else "FAIL"
        print(f"{mark} {module.name}/{outcome.name}")
        for problem in outcome.problems:
            print(f"    {problem}")
    failed = sum(not o.passed for o in outcomes)
    print(f"{len(outcomes) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed or not outcomes else EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from proxy.module.registry import ModuleRegistry
    from proxy.policy.loader import PolicyError

    module = _module_or_report(args)
    if module is None:
        return EXIT_FAILED
    try:
        raw = sys.stdin.buffer.read() if args.input == "-" else Path(args.input).read_bytes()
        value = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError) as exc:
        print(f"{args.input}: cannot read the input JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.policy:
        policy = _policy_or_report(args.policy)
        if policy is None:
            return PolicyError.EXIT_STATUS
        siblings = ModuleRegistry.load([module.path.parent]).modules  # a composite's steps
        answer = asyncio.run(_run_with_policy(module, value, policy, siblings))
        envelope = answer.envelope
        print(
            f"decision: {answer.decision}; attempts: "
            + ", ".join(f"{a.rung}:{a.target}={a.outcome}" for a in answer.attempts),
            file=sys.stderr,
        )
    else:
        envelope = offline_envelope(module, value)
    _print_json(envelope)
    return EXIT_OK if envelope.get("ok") else EXIT_FAILED


async def _run_with_policy(
    module: Module, value: Any, policy: Policy, modules: Mapping[str, Module]
) -> ModuleAnswer:
    """The server's module path, without the server: same pipeline, providers and decisions (a
    composite's steps from ``modules``)."""
    from proxy.compose.run import Composer
    from proxy.pipeline import ModuleRun, run_module
    from proxy.state.memory import MemoryBreakerStore
    from proxy.upstream.breaker import Breakers
    from proxy.upstream.http import upstream_session
    from proxy.upstream.registry import build_providers
    from proxy.upstream.router import Router

    async with upstream_session() as session:
        router = Router(Breakers(MemoryBreakerStore()))
        call = ModuleRun(module, value, policy, build_providers(policy, session), router)
        return await Composer(modules, run_module).run(call)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"COGPROXY_{name}", default)


@dataclass(frozen=True, slots=True)
class ServeOption:
    """A ``serve`` flag and its environment variable; the flag wins over the variable."""

    flag: str
    env: str
    cast: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    switch: bool = False
    """A flag without a value (its variable: 1/true/yes/on or 0/false/no/off)."""

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def memory_size(text: str) -> int:
    """``proxy.memory_budget.memory_size`` (``--memory-limit``), imported when a value is read: the
    budget's imports (the policy, the stores) are ``serve``'s, not the parser's."""
    from proxy.memory_budget import memory_size as read

    return read(text)


def _port_or_none(text: str) -> int | None:
    return int(text) or None


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _boolean(text: str) -> bool:
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise ValueError(text)


SERVE_OPTIONS = (
    ServeOption("--policy", "POLICY", str, None, "policy YAML"),
    ServeOption("--host", "HOST", str, "127.0.0.1", "bind address"),
    ServeOption("--port", "PORT", int, 8080, "port"),
    ServeOption(
        "--max-body-bytes",
        "MAX_BODY_BYTES",
        int,
        DEFAULT_MAX_BODY_BYTES,
        "largest request body the proxy reads; 413 beyond",
    ),
    ServeOption(
        "--max-upload-bytes",
        "MAX_UPLOAD_BYTES",
        int,
        DEFAULT_MAX_UPLOAD_BYTES,
        "largest body streamed through to a provider (uploads); 413 beyond",
    ),
    ServeOption(
        "--max-inflight-body-bytes",
        "MAX_INFLIGHT_BODY_BYTES",
        int,
        DEFAULT_MAX_INFLIGHT_BODY_BYTES,
        "memory all request bodies in flight may take, buffered and parsed; beyond: wait, then 503",
    ),
    ServeOption("--pool-size", "POOL_SIZE", int, DEFAULT_POOL_SIZE, "upstream connections kept in the pool"),
    ServeOption(
        "--idle-timeout",
        "IDLE_TIMEOUT",
        float,
        DEFAULT_IDLE_TIMEOUT_S,
        "seconds an idle client keep-alive connection stays open",
    ),
    ServeOption(
        "--client-read-timeout",
        "CLIENT_READ_TIMEOUT",
        float,
        DEFAULT_CLIENT_READ_TIMEOUT_S,
        "seconds for a request head to arrive, and the longest stall in a body; 408 beyond",
    ),
    ServeOption(
        "--max-connections",
        "MAX_CONNECTIONS",
        int,
        0,
        "open client connections at most (503 and close beyond); 0: derived from the open-file limit",
    ),
    ServeOption(
        "--drain-timeout",
        "DRAIN_TIMEOUT",
        float,
        DEFAULT_DRAIN_TIMEOUT_S,
        "seconds in-flight requests get to finish after SIGTERM",
    ),
    ServeOption("--api-keys", "API_KEYS", str, None, "comma-separated client keys; unset: no client auth"),
    ServeOption(
        "--api-keys-file",
        "API_KEYS_FILE",
        str,
        None,
        "file of client keys, one per line: KEY [name=NAME] [team=TEAM]",
    ),
    ServeOption(
        "--admin-keys",
        "ADMIN_KEYS",
        str,
        None,
        "comma-separated admin keys: GET /v1/usage, and judging any answer (POST /v1/feedback)",
    ),
    ServeOption("--admin-keys-file", "ADMIN_KEYS_FILE", str, None, "file of admin keys, one per line"),
    ServeOption(
        "--replicas-hint",
        "REPLICAS_HINT",
        int,
        1,
        "replicas sharing the limits: with Redis down each enforces limit / replicas",
    ),
    ServeOption(
        "--admin-host",
        "ADMIN_HOST",
        str,
        None,
        "bind address of the admin listener (health, readiness, metrics); unset: --host",
    ),
    ServeOption(
        "--admin-port",
        "ADMIN_PORT",
        _port_or_none,
        None,
        "serve /healthz, /readyz and /metrics (only those) on this port too",
    ),
    ServeOption("--metrics-port", "METRICS_PORT", _port_or_none, None, "deprecated alias of --admin-port"),
    ServeOption(
        "--redis-url",
        "REDIS_URL",
        str,
        None,
        "share breaker state, module context and the result cache through this Redis, "
        "e.g. redis://127.0.0.1:6379/0",
    ),
    ServeOption(
        "--redis-limits-timeout",
        "REDIS_LIMITS_TIMEOUT",
        float,
        LIMITS_TIMEOUT_S,
        "seconds a limit check waits for Redis before this replica falls back to its local windows",
    ),
    ServeOption(
        "--redis-durable-replicas",
        "REDIS_DURABLE_REPLICAS",
        int,
        DURABLE_REPLICAS,
        "keep each review, feedback and context record until N replicas of its Redis master have it "
        "(WAIT, in the background); 0: until the master has it",
    ),
    *(ServeOption(access.flag, access.env, str, None, access.help) for access in ACCESS_FLAGS),
    ServeOption(
        "--spool-dir",
        "SPOOL_DIR",
        str,
        None,
        "keep Redis writes not yet delivered (review records, context) in a file here, replayed on start",
    ),
    ServeOption(
        "--context-redact-names",
        "CONTEXT_REDACT_NAMES",
        str,
        None,
        "comma-separated field-name words whose _context values are redacted before the model "
        "(default: password,passwd,token,secret,key,authorization,cookie,credential)",
    ),
    ServeOption(
        "--reload-interval",
        "RELOAD_INTERVAL",
        float,
        DEFAULT_RELOAD_INTERVAL_S,
        "seconds between checks of policy and module files; 0: SIGHUP only",
    ),
    ServeOption(
        "--allowed-hosts",
        "ALLOWED_HOSTS",
        str,
        None,
        "comma-separated Host names served besides localhost/127.0.0.1/[::1] on a keyless loopback bind",
    ),
    ServeOption(
        "--allowed-origins",
        "ALLOWED_ORIGINS",
        str,
        None,
        "comma-separated browser Origins allowed on a keyless loopback bind (others: 403)",
    ),
    ServeOption(
        "--stream-session-ttl",
        "STREAM_SESSION_TTL",
        float,
        DEFAULT_STREAM_SESSION_TTL_S,
        "seconds a streamed module answer can be resumed after a dropped connection",
    ),
    ServeOption(
        "--otlp-endpoint",
        "OTLP_ENDPOINT",
        str,
        None,
        "send OpenTelemetry traces to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 "
        "(unset: OTEL_EXPORTER_OTLP_ENDPOINT decides; no endpoint: no tracing)",
    ),
    ServeOption(
        "--otel-content",
        "OTEL_CONTENT",
        _boolean,
        False,
        "record prompts and answers in trace spans, redacted and capped (default: no content)",
        switch=True,
    ),
    ServeOption(
        "--no-stream-recovery",
        "NO_STREAM_RECOVERY",
        _boolean,
        False,
        "refuse stream recovery (E4012); a client leaving a stream cancels its upstream call",
        switch=True,
    ),
    ServeOption(
        "--stream-heartbeat",
        "STREAM_HEARTBEAT",
        float,
        DEFAULT_STREAM_HEARTBEAT_S,
        "seconds of silence before a streamed answer sends an empty heartbeat chunk",
    ),
    ServeOption(
        "--stream-session-max-bytes",
        "STREAM_SESSION_MAX_BYTES",
        int,
        DEFAULT_STREAM_SESSION_MAX_BYTES,
        "memory the chunks kept for stream recovery may take (oldest finished sessions go first)",
    ),
    ServeOption(
        "--workers",
        "WORKERS",
        int,
        1,
        f"processes accepting on the port (SO_REUSEPORT), supervised by this one (1-{MAX_WORKERS}); "
        "1: this process serves",
    ),
    ServeOption(
        "--memory-limit",
        "MEMORY_LIMIT",
        memory_size,
        None,
        "bytes (256Mi, 1Gi...) all workers' memory bounds must fit in, or serve refuses to start; "
        "unset: the cgroup's limit; 0: no check",
    ),
    ServeOption("--log-format", "LOG_FORMAT", str, "json", "log format", ("json", "console")),
    ServeOption("--log-level", "LOG_LEVEL", str, "info", "log level"),
    ServeOption(
        "--log-flush-interval",
        "LOG_FLUSH_INTERVAL",
        float,
        DEFAULT_FLUSH_INTERVAL_S,
        "seconds JSON log lines may wait in memory before they are written (every line is kept; "
        "64 KiB of lines are written at once); 0: write each line as it comes",
    ),
)


def resolve_serve_options(args: argparse.Namespace) -> None:
    """Fill every flag left unset from its COGPROXY_* variable, else its default; a malformed
    variable is an error that names it and its value."""
    for option in SERVE_OPTIONS:
        if getattr(args, option.dest) is not None:
            continue
        raw = os.environ.get(f"COGPROXY_{option.env}")
        value = option.default
        if raw not in (None, ""):
            try:
                value = option.cast(raw)
            except ValueError as exc:
                kind = getattr(option.cast, "__name__", "value").removeprefix("_")
                raise ValueError(f"COGPROXY_{option.env}={raw!r} is not a valid {kind}") from exc
            if option.choices and value not in option.choices:
                raise ValueError(f"COGPROXY_{option.env}={raw!r} must be one of {', '.join(option.choices)}")
        setattr(args, option.dest, value)


def _env_list(name: str) -> list[str]:
    return [part for part in (_env(name) or "").split(os.pathsep) if part]


def _admin_port(args: argparse.Namespace) -> int | None:
    """``--admin-port``, or the deprecated ``--metrics-port`` (which now serves the probes too)."""
    legacy: int | None = args.metrics_port
    if legacy is None:
        admin: int | None = args.admin_port
        return admin
    print(
        "serve: --metrics-port (COGPROXY_METRICS_PORT) is deprecated: use --admin-port "
        "(COGPROXY_ADMIN_PORT), which serves /healthz, /readyz and /metrics",
        file=sys.stderr,
    )
    if args.admin_port not in (None, legacy):
        raise ValueError(
            f"--metrics-port {legacy} and --admin-port {args.admin_port} disagree: drop --metrics-port"
        )
    return legacy


def _redact_names(text: str | None) -> dict[str, tuple[str, ...]]:
    names = tuple(n.strip().lower() for n in (text or "").split(",") if n.strip())
    return {"context_redact_names": names} if names else {}


def serve_settings(args: argparse.Namespace) -> Settings:
    """The settings ``serve`` runs with, from its resolved flags (``resolve_serve_options``)."""
    from proxy.clients import read_identities
    from proxy.settings import Settings, host_names, origins, read_key_file
    from proxy.state.redis_flags import check_access
    from proxy.state.spool import spool_dir_of

    keys = frozenset(k.strip() for k in (args.api_keys or "").split(",") if k.strip())
    identities = read_identities(Path(args.api_keys_file)) if args.api_keys_file else {}
    keys |= frozenset(identities)
    admin = frozenset(k.strip() for k in (args.admin_keys or "").split(",") if k.strip())
    if args.admin_keys_file:
        admin |= read_key_file(Path(args.admin_keys_file))
    if admin & keys:
        raise ValueError("an admin key must not also be a client key (--admin-keys vs --api-keys)")
    if not 0 <= args.log_flush_interval <= MAX_FLUSH_INTERVAL_S:
        raise ValueError(
            f"--log-flush-interval must be 0..{MAX_FLUSH_INTERVAL_S:g} seconds, not {args.log_flush_interval}"
        )
    return Settings(
        policy_path=Path(args.policy),
        module_dirs=tuple(Path(d) for d in args.modules),
        host=args.host,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        max_upload_bytes=args.max_upload_bytes,
        max_inflight_body_bytes=args.max_inflight_body_bytes,
        pool_size=args.pool_size,
        idle_timeout_s=args.idle_timeout,
        client_read_timeout_s=args.client_read_timeout,
        max_connections=args.max_connections,
        drain_timeout_s=args.drain_timeout,
        log_flush_interval_s=args.log_flush_interval,
        api_keys=keys,
        client_identities=identities,
        admin_keys=admin,
        replicas_hint=args.replicas_hint,
        redis_url=args.redis_url or None,
        redis_limits_timeout_s=args.redis_limits_timeout,
        redis_durable_replicas=args.redis_durable_replicas,
        **check_access(args.redis_url, args),
        admin_host=args.admin_host or None,
        admin_port=_admin_port(args),
        spool_dir=spool_dir_of(Path(args.spool_dir), args.worker_slot) if args.spool_dir else None,
        reload_interval_s=args.reload_interval,
        allowed_hosts=host_names(args.allowed_hosts),
        allowed_origins=origins(args.allowed_origins),
        stream_session_ttl_s=args.stream_session_ttl,
        stream_recovery=not args.no_stream_recovery,
        stream_heartbeat_s=args.stream_heartbeat,
        stream_session_max_bytes=args.stream_session_max_bytes,
        otlp_endpoint=args.otlp_endpoint or None,
        otel_content=bool(args.otel_content),
        workers=args.workers,
        worker=args.worker_slot,
        **_redact_names(args.context_redact_names),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from proxy.memory_budget import refusal as memory_refusal
    from proxy.observability.logging import configure_logging
    from proxy.policy.loader import PolicyError, load_policy
    from proxy.state.spool import adopt_spools
    from proxy.supervisor import Plan, exec_supervisor

    try:
        resolve_serve_options(args)
    except ValueError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.policy:
        print("serve: a policy is required (--policy FILE or COGPROXY_POLICY)", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = serve_settings(args)
        configure_logging(args.log_format, args.log_level)
        policy = load_policy(settings.policy_path)  # fail fast, with the path and the key, before binding
        refused = None if settings.worker is not None else memory_refusal(settings, policy, args.memory_limit)
        if refused is not None:
            raise ValueError(refused)
        if args.spool_dir and settings.worker is None:
            adopt_spools(Path(args.spool_dir), settings.workers)
    except (PolicyError, ValueError, OSError) as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if settings.workers > 1 and settings.worker is None:
        taken = _taken_port(settings)
        if taken is not None:
            print(taken, file=sys.stderr)
            return EXIT_USAGE
        plan = Plan(
            settings.workers, settings.host, settings.port, settings.drain_timeout_s, bool(settings.redis_url)
        )
        exec_supervisor(plan, args.log_format, args.log_level, args.arguments)  # this process becomes it
    loop = None
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # uvloop is optional (the `fast` extra)
        pass
    try:
        _run_app(settings, loop)
    except OSError as exc:
        print(listen_error(exc, settings.host, settings.port), file=sys.stderr)
        return EXIT_USAGE
    except (PolicyError, ValueError) as exc:  # raised by start-up hooks (policy, Redis URL)
        print(f"serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _taken_port(settings: Settings) -> str | None:
    """Under ``--workers``, before the workers bind with SO_REUSEPORT: the error a single process
    would meet for a port that is taken (even by another group of workers), else None."""
    from proxy.supervisor import check_ports

    addresses = [(settings.host, settings.port)]
    if settings.admin_port is not None:
        addresses.append((settings.admin_bind_host, settings.admin_port))
    try:
        asyncio.run(check_ports(addresses))
    except OSError as exc:
        return listen_error(exc, settings.host, settings.port)
    return None


_BIND_ADDRESS = re.compile(r"address \('?(?P<host>[^',]+)'?, (?P<port>\d+)")


def listen_error(exc: OSError, host: str, port: int) -> str:
    """One line for a socket that cannot be opened, naming the address it was for."""
    found = _BIND_ADDRESS.search(str(exc))
    where = f"{found['host']}:{found['port']}" if found else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {where}: address already in use (is another cogproxy running?)"
    reason = (exc.strerror or str(exc)).lower()
    return f"cannot listen on {where}: {reason}"


def _run_app(settings: Settings, loop: asyncio.AbstractEventLoop | None) -> None:
    from proxy.app import build_app
    from proxy.server import run as run_server
    from proxy.supervisor import watch_parent

    def started() -> None:
        print(f"cogproxy serving on http://{settings.host}:{settings.port}", flush=True)
        if settings.worker is not None:
            watch_parent(asyncio.get_running_loop())

    run_server(build_app(settings), settings, loop=loop, on_started=started)


def cmd_policy_check(args: argparse.Namespace) -> int:
    from proxy.policy.loader import PolicyError, load_policy
    from proxy.policy.report import summary

    try:
        policy = load_policy(Path(args.file))
    except PolicyError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}")
        return PolicyError.EXIT_STATUS
    print("\n".join(summary(policy)))
    return EXIT_OK


def cmd_policy_explain(args: argparse.Namespace) -> int:
    from proxy.module.registry import ModuleRegistry
    from proxy.policy.decide import Meta
    from proxy.policy.loader import PolicyError
    from proxy.policy.report import explain

    policy = _policy_or_report(args.policy)
    if policy is None:
        return PolicyError.EXIT_STATUS
    if args.module:
        registry = ModuleRegistry.load(Path(d) for d in args.modules)
        module = registry.get(args.module)
        if module is None:
            print(
                f"no module {args.module!r} in {', '.join(args.modules)} (known: "
                f"{', '.join(registry.names()) or 'none'})",
                file=sys.stderr,
            )
            return EXIT_USAGE
        tier, label = module.tier, f"module {module.name} ({module.tier} tier"
        label += ", with overrides)" if module.name in policy.modules else ")"
    else:
        tier, label = args.tier, f"tier {args.tier}"
    thresholds = policy.thresholds_for(args.module or "", tier)
    rung = policy.start_rung(thresholds) if args.rung is None else _rung_index(policy, args.rung)
    if rung is None:
        names = ", ".join(r.name for r in policy.ladder)
        print(
            f"--rung {args.rung!r}: no such rung (rungs: {names}; or an index 0..{len(policy.ladder) - 1})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    meta = Meta(args.confidence, args.risk)
    print("\n".join(explain(policy, thresholds, meta, rung, label, module=args.module or "", tier=tier)))
    return EXIT_OK


_EXAMPLES = """\
examples:
  cogproxy serve --policy policies/demo.yaml            the proxy on 127.0.0.1:8080, offline demo
  cogproxy new sentiment --tier decision                a module to start from (modules/sentiment)
  cogproxy validate sentiment --v22 && cogproxy test sentiment
  echo '{"text": "hi"}' | cogproxy run sentiment --input -
  cogproxy policy explain --policy policies/default.yaml --module code-reviewer --confidence 0.6 --risk low
  cogproxy calibration report --prometheus http://localhost:9090

'cogproxy COMMAND --help' describes a command; docs/cli.md has the full reference."""


def _module_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("module", help="a module name (looked up in --modules) or a module directory")
    p.add_argument(
        "--modules",
        action="append",
        default=None,
        help="where module names are looked up, repeatable (COGPROXY_MODULES; default: modules)",
    )


def _rung_index(policy: Policy, text: str) -> int | None:
    """The ladder position ``text`` names: a rung name or an index; None if neither."""
    for index, rung in enumerate(policy.ladder):
        if rung.name == text:
            return index
    if text.isdigit() and int(text) < len(policy.ladder):
        return int(text)
    return None


def _confidence(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is outside 0..1 (meta.confidence is a probability)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cogproxy",
        description="cognitive-proxy: an OpenAI-compatible sidecar enforcing Cognitive Modules contracts.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cogproxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    _serve_parser(sub)
    _policy_parser(sub)
    _module_parsers(sub)
    calibration_command.add_parser(sub)
    return parser


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve``: one flag per ``SERVE_OPTIONS`` entry, each also read from its variable."""
    p = sub.add_parser("serve", help="run the proxy (flags also read from COGPROXY_* variables)")
    p.add_argument(
        "--modules",
        action="append",
        default=None,
        help="module directory, repeatable (COGPROXY_MODULES, os.pathsep-separated; default: modules)",
    )
    for option in SERVE_OPTIONS:
        default = "unset" if option.default is None else option.default
        if option.switch:
            p.add_argument(
                option.flag,
                action="store_const",
                const=True,
                default=None,
                help=f"{option.help} (COGPROXY_{option.env})",
            )
            continue
        p.add_argument(
            option.flag,
            type=option.cast,
            choices=option.choices,
            default=None,
            help=f"{option.help} (COGPROXY_{option.env}; default: {default})",
        )
    add_refused_password_flag(p)
    p.add_argument(WORKER_FLAG, type=int, default=None, help=argparse.SUPPRESS)  # set by the supervisor
    p.set_defaults(func=cmd_serve)


def _policy_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``policy check``, ``explain``, ``tune`` and ``simulate``."""
    policy = sub.add_parser("policy", help="check a policy, explain a decision, tune or simulate one")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    p = policy_sub.add_parser("check", help="validate a policy and print a summary")
    p.add_argument("file", help="the policy YAML")
    p.set_defaults(func=cmd_policy_check)
    p = policy_sub.add_parser("explain", help="the decision for an answer's confidence and risk")
    p.add_argument("--policy", required=True, help="the policy YAML")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--module", help="a module name (its tier and per-module overrides apply)")
    which.add_argument("--tier", choices=("exec", "decision", "exploration"), help="a tier's thresholds")
    p.add_argument("--confidence", type=_confidence, required=True, help="the answer's meta.confidence, 0..1")
    p.add_argument(
        "--risk", choices=("none", "low", "medium", "high"), required=True, help="the answer's meta.risk"
    )
    p.add_argument(
        "--rung", help="the rung that answered: its name or index (default: the tier's start rung)"
    )
    p.add_argument("--modules", action="append", default=None, help="module directory (default: modules)")
    p.set_defaults(func=cmd_policy_explain)
    policy_command.add_parsers(policy_sub)


def _module_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The module commands: ``new``, ``validate``, ``conformance``, ``test``, ``run``."""
    p = sub.add_parser("new", help="create a module that validates and passes its golden test")
    p.add_argument("name", help="the module name (lowercase letters, digits, '-')")
    p.add_argument(
        "--tier",
        choices=("exec", "decision", "exploration"),
        default="decision",
        help="exec: acted on automatically; decision: informs a judgement; exploration: ideas "
        "(default: decision)",
    )
    p.add_argument("--dir", default="modules", help="where to create it (default: modules)")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("validate", help="check a module: files, schemas, golden cases")
    _module_arguments(p)
    p.add_argument("--v22", action="store_true", help="also run the v2.2 checks of module-format.md")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("conformance", help="run envelope test vectors (spec/test-vectors format)")
    p.add_argument(
        "directory",
        nargs="?",
        default=None,
        help="a directory of vectors (default: the official v2.2 vectors shipped with the package)",
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help=f"print the conformance table as the Conformance section of {conformance_table.DOCS_PAGE}",
    )
    p.add_argument(
        "--update-docs",
        nargs="?",
        const=conformance_table.DOCS_PAGE,
        default=None,
        metavar="PAGE",
        help=f"rewrite the conformance section of PAGE in place (default: {conformance_table.DOCS_PAGE})",
    )
    # The flag's name before the docs moved out of the README; same behaviour, PAGE required.
    p.add_argument("--update-readme", dest="update_docs", metavar="PAGE", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_conformance)

    p = sub.add_parser("test", help="run a module's golden tests")
    _module_arguments(p)
    p.add_argument(
        "--policy",
        default=None,
        help="answer the cases with this policy's providers (default: the module's own examples, offline)",
    )
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("run", help="execute one module call and print the envelope")
    _module_arguments(p)
    p.add_argument("--input", required=True, help="input JSON file, or - for stdin")
    p.add_argument(
        "--policy",
        default=_env("POLICY"),
        help="route through this policy's providers and ladder (COGPROXY_POLICY); "
        "without it the module's own golden examples answer (offline)",
    )
    p.set_defaults(func=cmd_run)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.arguments = list(sys.argv[1:] if argv is None else argv)  # what workers are started with
    if getattr(args, "modules", "unset") is None:
        args.modules = _env_list("MODULES") or ["modules"]
    code: int = args.func(args)
    return code


async def _golden_with_policy(module: Module, policy: Policy) -> list[CaseOutcome]:
    """Golden cases answered by the policy's providers, through the server's pipeline (a
    composite's steps from the modules beside it)."""
    from proxy.compose.run import Composer
    from proxy.module.golden import CaseOutcome, evaluate, load_cases
    from proxy.module.registry import ModuleRegistry
    from proxy.pipeline import ModuleRun, run_module
    from proxy.state.memory import MemoryBreakerStore
    from proxy.upstream.breaker import Breakers
    from proxy.upstream.http import upstream_session
    from proxy.upstream.registry import build_providers
    from proxy.upstream.router import Router

    cases, outcomes = load_cases(module)
    composer = Composer(ModuleRegistry.load([module.path.parent]).modules, run_module)
    async with upstream_session() as session:
        providers = build_providers(policy, session)
        router = Router(Breakers(MemoryBreakerStore()))
        for case in cases:
            answer = await composer.run(ModuleRun(module, case.input, policy, providers, router))
            problems = evaluate(case, answer.envelope, answer.decision)
            outcomes.append(CaseOutcome(case.name, tuple(problems), answer.envelope))
    return outcomes
