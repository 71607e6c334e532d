"""``fedcluster-device``: one long-lived process that answers every message of a SuperNode.

A Flower 1.42 SuperNode started with ``--isolation subprocess`` (the default) starts a
SuperExec, which starts a fresh ``flwr-clientapp`` process for every message: each imports
Flower's runtime again, and three Python processes do not fit a phone's memory
(docs/devices.md). With ``flower-supernode --isolation process`` the SuperNode starts no
SuperExec: whatever polls its Runtime API (``--port``) runs its tasks. This worker is that
poller: it claims a task (``AcquireTask``, as SuperExec does), pulls the message, the run's
Context and FAB, runs fedcluster's own ClientApp (:mod:`fedcluster.client.app`) in this
process, pushes the reply and the updated Context, and claims the next task, sending the
task's heartbeats while it runs, as Flower's ``run_clientapp`` does (the same calls, from
``flwr.supernode.runtime.run_clientapp``), but without exiting after one task.

It never runs code from the FAB: a run whose FAB is not fedcluster's (its ``fab_id`` and
its pyproject's ClientApp, :func:`fab_refusal`) gets an error reply that says so. It
relies on Flower's internal Runtime API (:data:`VERIFIED_FLOWER` names the versions it was
run with) and refuses to start, naming the version, when those internals are missing.
"""

from __future__ import annotations

import io
import signal
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

APP_ID = "fedcluster/fedcluster"  # pyproject.toml: [tool.flwr.app] publisher / [project] name
CLIENTAPP_REF = "fedcluster.client.app:app"  # pyproject.toml: [tool.flwr.app.components] clientapp
VERIFIED_FLOWER = ("1.42",)  # the flwr releases this worker was run with (docs/devices.md)
PROG = "fedcluster-device"


class WorkerError(RuntimeError):
    """The worker cannot start or go on (the message says why)."""


def fab_refusal(fab_id: str, fab_content: bytes) -> str | None:
    """Why this worker must not answer a run of this FAB, or None when it is fedcluster's.

    The worker answers with its own installed ClientApp, never the FAB's code, so a run of
    another app (or of an app that names another ClientApp) would get wrong answers."""
    if fab_id != APP_ID:
        return f"this device runs only the {APP_ID!r} app (fedcluster-device); the run's FAB is {fab_id!r}"
    try:
        with zipfile.ZipFile(io.BytesIO(fab_content)) as bundle:
            config = tomllib.loads(bundle.read("pyproject.toml").decode("utf-8"))
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return f"the run's FAB has no readable pyproject.toml ({type(exc).__name__}: {exc})"
    components = config.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    named = components.get("clientapp") if isinstance(components, dict) else None
    if named != CLIENTAPP_REF:
        return f"the run's FAB names ClientApp {named!r}; this device runs only {CLIENTAPP_REF!r} (fedcluster-device)"
    return None


def flower_runtime():
    """Flower's internal Runtime API calls this worker uses; a :class:`WorkerError` naming
    the installed flwr version when any is missing (they are not a public API)."""
    try:
        import flwr
        from flwr.proto.runtime_pb2 import AcquireTaskRequest  # noqa: F401
        from flwr.supercore.constant import TaskType  # noqa: F401
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http  # noqa: F401
        from flwr.supercore.interceptors import (  # noqa: F401
            RuntimeTokenHttpInterceptor,
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
        )
        from flwr.supercore.retry import make_simple_http_retry_invoker  # noqa: F401
        from flwr.supercore.runtime import RuntimeHttpClient  # noqa: F401
        from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor  # noqa: F401
        from flwr.supercore.task_identity import TaskIdentity  # noqa: F401
        from flwr.supernode.runtime import run_clientapp  # noqa: F401
        from flwr.supernode.runtime.run_clientapp import (  # noqa: F401
            pull_task_input,
            push_message,
            push_task_output,
        )
    except ImportError as exc:
        version = _flower_version()
        raise WorkerError(
            f"flwr {version} lacks the internal Runtime API this worker uses ({exc}); it was verified with flwr "
            f"{', '.join(VERIFIED_FLOWER)}: install one of those, or run the SuperNode without --isolation process"
        ) from None
    return flwr


def _flower_version() -> str:
    try:
        import flwr

        return str(flwr.__version__)
    except ImportError:
        return "(not installed)"


def verified(version: str) -> bool:
    """Whether ``version`` (``1.42.0``) is a release this worker was run with."""
    return any(version == v or version.startswith(v + ".") for v in VERIFIED_FLOWER)


@dataclass(frozen=True)
class Settings:
    address: str  # the SuperNode's Runtime API, HOST:PORT
    root_certificates: bytes | None  # None: plain HTTP (--insecure)
    secret: bytes | None  # the SuperExec auth secret the SuperNode was given, or None
    poll: float  # seconds between AcquireTask calls while there is nothing to do
    wait: float  # seconds to wait for the SuperNode at start


def _client(settings: Settings, component: str, token: str | None = None):
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.interceptors import SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor

    interceptors = [RuntimeTracingInterceptor(), RuntimeVersionHttpInterceptor(component_name=component)]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    elif settings.secret is not None:
        interceptors.append(
            SuperExecAuthHttpInterceptor(
                master_secret=settings.secret, protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})
            )
        )
    return RuntimeHttpClient.from_server_address(
        server_address=settings.address,
        insecure=settings.root_certificates is None,
        root_certificates=settings.root_certificates,
        interceptors=interceptors,
        retry_invoker=without_self_interrupt(make_simple_http_retry_invoker()),
    )


def without_self_interrupt(invoker):
    """Flower's HTTP retry invoker, except that a 401 (a task token the SuperNode no longer
    honours: the task was given up while its message was in transit; or a wrong auth secret)
    raises the error to the caller: Flower's own answer, SIGINT to this process, would end
    the worker and with it every later message (seen behind a lossy link)."""
    import httpx

    flower_rule = invoker.should_giveup

    def should_giveup(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == httpx.codes.UNAUTHORIZED:
            return True
        return flower_rule(exc) if flower_rule is not None else False

    invoker.should_giveup = should_giveup
    return invoker


def serve_task(settings: Settings, token: str) -> str:
    """Run one claimed task (its ``token``) to its end; a line that says what was done.

    As ``flwr-clientapp`` does: heartbeats while it runs, the message, Context, Run and FAB
    pulled, the reply and the Context pushed, the task's status pushed last; a ClientApp
    that raises becomes an error reply. Never raises for what happens inside the task: the
    next task must still be served."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    from fedcluster.client.app import app

    started = time.perf_counter()
    client = _client(settings, "flwr-clientapp", token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    message = context = reply = None
    status, details, what = SubStatus.FAILED, "the task's input could not be pulled", "a task"
    heartbeat.start()
    try:
        message, context, run, fab = pull_task_input(client)
        what = f"run {run.run_id} {message.metadata.message_type}"
        refusal = fab_refusal(run.fab_id, fab.content)
        if refusal is not None:
            details = refusal
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=refusal), reply_to=message)
        else:
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
    except Exception as exc:  # the ClientApp, or the Runtime API while pulling: an error reply if we can
        details = f"{type(exc).__name__}: {exc}"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except Exception as exc:  # the run stopped, the SuperNode went away: Flower re-queues or drops it
            status, details = SubStatus.FAILED, f"the reply could not be pushed: {type(exc).__name__}: {exc}"
        try:
            push_task_output(client=client, context=context, sub_status=status, details=details)
        except Exception as exc:
            details += f"; the task's status could not be pushed: {type(exc).__name__}: {exc}"
        heartbeat.stop()
        client.close()
        TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = None
    outcome = "done" if status == SubStatus.COMPLETED else f"failed ({' '.join(details.split())[:300]})"
    return f"{what} {outcome} in {time.perf_counter() - started:.2f} s"


def wait_for(address: str, seconds: float) -> None:
    """Until something listens on ``address`` (HOST:PORT), or a :class:`WorkerError`."""
    import socket

    host, port = split_address(address)
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise WorkerError(
                    f"nothing answers on {address} after {seconds:g} s ({exc}): start the SuperNode with "
                    f"--isolation process and --port {port} (its Runtime API) first"
                ) from None
            time.sleep(0.5)


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port); a ValueError naming it otherwise."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--runtime-api-address must be HOST:PORT (port 1-65535), got {address!r}")
    return host, int(port)


def serve(settings: Settings, echo=print, max_tasks: int = 0) -> int:
    """Claim and run tasks until stopped (or ``max_tasks`` of them); how many were run."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    import fedcluster.client.app  # noqa: F401  every import before the first task, once

    wait_for(settings.address, settings.wait)
    acquirer = _client(settings, "SuperExec")
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    echo(f"{PROG}: serving the SuperNode on {settings.address} (pid {__import__('os').getpid()})")
    served = 0
    try:
        while not max_tasks or served < max_tasks:
            claimed = acquirer.AcquireTask(request)
            if not (claimed.HasField("task") and claimed.token):
                time.sleep(settings.poll)
                continue
            echo(f"{PROG}: task {claimed.task.task_id}: {serve_task(settings, claimed.token)}")
            served += 1
    finally:
        acquirer.close()
    return served


def _stop(signum, frame):  # SIGTERM ends the worker as Ctrl-C does
    raise KeyboardInterrupt


def build_parser():
    from fedcluster.tools.cli import ToolParser, number

    parser = ToolParser(
        prog=PROG,
        description="Serve every message of a SuperNode started with '--isolation process' in this one "
        "process, with fedcluster's own ClientApp (instead of flower-superexec and a flwr-clientapp "
        "process per message).",
    )
    parser.add_argument("--runtime-api-address", required=True, metavar="HOST:PORT", help="the SuperNode's --port")
    trust = parser.add_mutually_exclusive_group(required=True)
    trust.add_argument("--insecure", action="store_true", help="plain HTTP (the SuperNode has no --ssl-certfile)")
    trust.add_argument("--root-certificates", metavar="CA", help="the CA of the SuperNode's --ssl-certfile")
    parser.add_argument(
        "--superexec-auth-secret-file", metavar="FILE", help="the secret file the SuperNode was given, if any"
    )
    parser.add_argument(
        "--poll-s", type=number(0.01, 60), default=0.5, help="seconds between polls when idle (default 0.5)"
    )
    parser.add_argument(
        "--wait-s", type=number(0, 3600), default=60.0, help="seconds to wait for the SuperNode (default 60)"
    )
    return parser


def _read(path: str, flag: str) -> bytes:
    file = Path(path).expanduser()
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise WorkerError(f"{flag} {file}: {exc.strerror or exc}") from None
    if not data:
        raise WorkerError(f"{flag} {file} is empty")
    return data


def main(argv: list[str] | None = None) -> int:
    from fedcluster.tools.cli import refuse

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        split_address(args.runtime_api_address)
    except ValueError as exc:
        parser.error(str(exc))
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        flwr = flower_runtime()
        if not verified(str(flwr.__version__)):
            print(f"{PROG}: warning: flwr {flwr.__version__} was not verified (verified: {VERIFIED_FLOWER})")
        settings = Settings(
            args.runtime_api_address,
            _read(args.root_certificates, "--root-certificates") if args.root_certificates else None,
            _read(args.superexec_auth_secret_file, "--superexec-auth-secret-file")
            if args.superexec_auth_secret_file
            else None,
            args.poll_s,
            args.wait_s,
        )
        serve(settings, echo=lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", flush=True))
        return 0
    except WorkerError as exc:
        return refuse(PROG, exc)
    except KeyboardInterrupt:
        print(f"{PROG}: stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # the Runtime API refused us (TLS, auth): one line, not a traceback
        return refuse(PROG, f"the SuperNode on {args.runtime_api_address}: {type(exc).__name__}: {exc}")
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
