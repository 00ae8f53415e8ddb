"""How clients and adapters reach the Muster server: plaintext on loopback, TLS (and mutual TLS
with a client certificate) when the server asks for it. One place, so the CLI, the client library
and every adapter take the same options and environment variables:

    --server A[,B...] MUSTER_SERVER     the server, or the servers of a replicated deployment
    --tls-ca FILE     MUSTER_TLS_CA     CA bundle that signed the server's certificate (turns TLS on)
    --tls-cert FILE   MUSTER_TLS_CERT   client certificate (mutual TLS; a backend's identity)
    --tls-key FILE    MUSTER_TLS_KEY    its private key
    --tls-server-name MUSTER_TLS_SERVER_NAME   name to verify when it differs from the address's host
    --token TOKEN / --token-file FILE   MUSTER_TOKEN / MUSTER_TOKEN_FILE   bearer token (server auth policy)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

# The largest message, both ways: the server's default --max-message-bytes, and what every channel
# made here reads. A decision or a Job carries its task groups' annotations and commands, so a job
# the server accepted can make a reply past gRPC's default 4 MiB receive limit, which a client with
# that default could never read (a backend would reconnect and get the same decision again).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Replicated servers (docs/ha.md): a follower refuses writes and backend calls with UNAVAILABLE and
# names the leader's address in this trailing metadata key (absent while no leader is known).
LEADER_METADATA = "muster-leader"

DEFAULT_SERVER = "127.0.0.1:50051"

# The RPCs only the leader serves (a follower refuses them with UNAVAILABLE): writes and the
# backend feed. Everything else is a read any replica answers from its copy of the state.
LEADER_ONLY = frozenset(
    {
        "RegisterBackend",
        "SyncSnapshot",
        "SendDeltas",
        "StreamDecisions",
        "StreamDecisionBatches",
        "AckDecisions",
        "Heartbeat",
        "SubmitJob",
        "SubmitJobs",
        "CancelJob",
        "HoldJob",
        "ReleaseJob",
        "RequeueJob",
        "CreateQueue",
        "UpdateQueue",
        "DeleteQueue",
        "UpdateConfig",
        # Reads of what only the leader's memory holds: nodes (backends send them to the
        # leader). Task output is stored (GetTaskLogs, WatchTaskLogs): any replica reads it.
        "ListNodes",
    }
)


def parse_addresses(value: str | Iterable[str] | None, option: str = "--server") -> list[str]:
    """``"a:1, b:2,,"`` (or a list of such strings) -> ``["a:1", "b:2"]``: trimmed, empty items and
    repeats dropped, order kept. ValueError naming ``option`` when no address is left."""
    items = [value] if isinstance(value, str) else list(value or ())
    addresses: list[str] = []
    for item in items:
        for part in str(item).split(","):
            address = part.strip()
            if address and address not in addresses:
                addresses.append(address)
    if not addresses:
        raise ValueError(
            f"{option}: no server address in {value!r} (expected HOST:PORT[,HOST:PORT...])"
        )
    return addresses


def server_arg(text: str) -> str:
    """The argparse ``type`` of a ``--server`` option: the list checked and normalized
    (``"a:1, b:2"`` -> ``"a:1,b:2"``); argparse names the option in the error."""
    try:
        return ",".join(parse_addresses(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"no server address in {text!r} (expected HOST:PORT[,HOST:PORT...])"
        ) from None


def add_server_arg(parser: argparse.ArgumentParser) -> None:
    """``--server`` for a backend (agent, adapters): one address or a deployment's list, from
    MUSTER_SERVER by default; the backend follows the leader."""
    parser.add_argument(
        "--server",
        type=server_arg,
        default=os.environ.get("MUSTER_SERVER") or DEFAULT_SERVER,
        help="Muster server HOST:PORT, or a replicated deployment's servers HOST:PORT,HOST:PORT,... "
        f"(the leader is followed; env MUSTER_SERVER; default {DEFAULT_SERVER})",
    )


def leader_hint(error: BaseException) -> str | None:
    """The leader's address a refusing follower named (``muster-leader``), if any."""
    if not isinstance(error, grpc.aio.AioRpcError) or error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == LEADER_METADATA:
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            return text.strip() or None
    return None


def method_name(method: str | bytes) -> str:
    """``/muster.v1.Scheduler/SubmitJob`` -> ``SubmitJob``."""
    text = method.decode() if isinstance(method, bytes) else method
    return text.rsplit("/", 1)[-1]


class AddressBook:
    """The servers of one deployment: the configured addresses (plus leaders named by hints),
    the one in use and the leader when known. Shared by :class:`FailoverChannel` and the adapter
    runtime, so both move the same way: to the leader a refusal names, else to the next address.
    """

    def __init__(self, addresses: str | Iterable[str], option: str = "--server") -> None:
        self.addresses = parse_addresses(addresses, option)
        self.current = self.addresses[0]
        self.leader: str | None = None

    def start(self, leader_only: bool) -> str:
        """Where a call starts: the leader for what only it serves (when known), else the address
        in use (a read stays on the replica that works)."""
        return self.leader if leader_only and self.leader else self.current

    def follow(self, leader: str) -> str:
        """A server named ``leader`` as the leader: use it (added to the list when new)."""
        self.leader = self.current = leader
        if leader not in self.addresses:
            self.addresses.append(leader)
        return leader

    def failed(self, address: str, error: BaseException) -> str:
        """``address`` failed with ``error`` (UNAVAILABLE or a dropped connection): returns, and
        makes current, the address to try next."""
        hint = leader_hint(error)
        if hint is not None and hint != address:
            # The hinted leader is used even when it is not in the list (a new replica).
            self.leader = hint
            if hint not in self.addresses:
                self.addresses.append(hint)
            self.current = hint
            return hint
        if self.leader == address:
            self.leader = None
        position = self.addresses.index(address) if address in self.addresses else -1
        self.current = self.addresses[(position + 1) % len(self.addresses)]
        return self.current

    def answered(self, address: str, *, leader: bool = False) -> None:
        """A server at ``address`` answered (``leader``: it served a leader-only call)."""
        self.current = address
        if leader:
            self.leader = address


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert)

    @classmethod
    def from_env(cls) -> ClientTls:
        env = os.environ
        return cls(
            env.get("MUSTER_TLS_CA") or None,
            env.get("MUSTER_TLS_CERT") or None,
            env.get("MUSTER_TLS_KEY") or None,
            env.get("MUSTER_TLS_SERVER_NAME") or None,
        )


def add_tls_args(parser: argparse.ArgumentParser) -> None:
    """The TLS options every command line that talks to the server takes."""
    env = ClientTls.from_env()
    group = parser.add_argument_group("TLS (see docs/security.md)")
    group.add_argument(
        "--tls-ca", default=env.ca, help="CA bundle of the server's certificate (env MUSTER_TLS_CA)"
    )
    group.add_argument(
        "--tls-cert",
        default=env.cert,
        help="client certificate for mutual TLS (env MUSTER_TLS_CERT)",
    )
    group.add_argument("--tls-key", default=env.key, help="its private key (env MUSTER_TLS_KEY)")
    group.add_argument(
        "--tls-server-name",
        default=env.server_name,
        help="name to verify in the server's certificate (env MUSTER_TLS_SERVER_NAME)",
    )


def tls_from_args(args: argparse.Namespace) -> ClientTls:
    tls = ClientTls(args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    if bool(tls.cert) != bool(tls.key):
        raise ValueError("--tls-cert and --tls-key go together")
    return tls


def add_token_args(parser: argparse.ArgumentParser) -> None:
    """The bearer-token options of command lines that act for a user."""
    group = parser.add_argument_group("authentication (see docs/security.md)")
    group.add_argument(
        "--token", default=os.environ.get("MUSTER_TOKEN"), help="bearer token (env MUSTER_TOKEN)"
    )
    group.add_argument(
        "--token-file",
        default=os.environ.get("MUSTER_TOKEN_FILE"),
        help="file holding the bearer token (env MUSTER_TOKEN_FILE)",
    )


def token_from_args(args: argparse.Namespace) -> str | None:
    if args.token:
        return str(args.token)
    if args.token_file:
        with open(args.token_file) as f:
            return f.read().strip() or None
    return None


class _Headers:
    """Adds fixed metadata to every call: ``authorization: Bearer <token>`` (works on plaintext
    loopback too, unlike grpc's access-token call credentials) and the caller's user claim."""

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers

    def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self.headers)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files an interceptor under the first call kind it implements only, so each kind gets an
# object of its own (one class for both sent no token on streaming calls).
class _UnaryHeaders(_Headers, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self.details(details), request)


class _StreamHeaders(_Headers, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self.details(details), request)


class _BidiHeaders(_Headers, grpc.aio.StreamStreamClientInterceptor):  # reflection
    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self.details(details), requests)


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel(
    address: str | Sequence[str],
    tls: ClientTls | None = None,
    options: list[tuple[str, object]] | None = None,
    *,
    token: str | None = None,
    user: str | None = None,
    failover_timeout: float | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS when ``tls`` asks for it, else plaintext; with
    ``token``, every call carries it as a bearer token; with ``user``, the ``x-muster-user`` claim
    a server without authentication records as the owner of submitted jobs (ignored otherwise).
    Messages up to ``MAX_MESSAGE_BYTES`` are read unless ``options`` say otherwise.

    ``address`` may list several servers (``"a:1,b:2"`` or a list): the result is then a
    :class:`FailoverChannel` over them, as it is with one address when ``failover_timeout`` is
    given; a single address otherwise gets a plain channel, exactly as before replication."""
    addresses = parse_addresses(address, "address")
    if len(addresses) == 1 and failover_timeout is None:
        return _channel(addresses[0], tls, options, token=token, user=user)
    return FailoverChannel(
        addresses,
        lambda one: _channel(one, tls, options, token=token, user=user),
        failover_timeout=DEFAULT_FAILOVER_TIMEOUT if failover_timeout is None else failover_timeout,
    )


def _channel(
    address: str,
    tls: ClientTls | None,
    options: list[tuple[str, object]] | None,
    *,
    token: str | None,
    user: str | None,
) -> grpc.aio.Channel:
    opts = list(options or [])
    if not any(name == "grpc.max_receive_message_length" for name, _ in opts):
        opts.append(("grpc.max_receive_message_length", MAX_MESSAGE_BYTES))
    headers = [("authorization", f"Bearer {token}")] if token else []
    if user:
        headers.append(("x-muster-user", user))
    interceptors: list[Any] | None = (
        [kind(headers) for kind in (_UnaryHeaders, _StreamHeaders, _BidiHeaders)]
        if headers
        else None
    )
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca),
        private_key=_read(tls.key),
        certificate_chain=_read(tls.cert),
    )
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, credentials, options=opts, interceptors=interceptors)


# ---------------------------------------------------------------------------------------------
# Failover across the servers of a replicated deployment (docs/ha.md)
# ---------------------------------------------------------------------------------------------

DEFAULT_FAILOVER_TIMEOUT = 30.0
FAILOVER_BACKOFF_INITIAL = 0.05
FAILOVER_BACKOFF_MAX = 1.0


class FailoverChannel(grpc.aio.Channel):
    """One channel over the servers of a deployment: a channel per address, opened on first use.

    Unary calls: an UNAVAILABLE answer (a follower's refusal, a leader that lost its lease, a
    server that is down or a connection dropped mid-call) sends the call again to the leader the
    refusal names in ``muster-leader``, else to the next address, after a short backoff
    (``FAILOVER_BACKOFF_INITIAL`` doubling up to ``FAILOVER_BACKOFF_MAX``). Every known address is
    tried once whatever the time; after that the call is retried until ``failover_timeout``
    seconds have passed since it started, then the last error is raised. ``timeout`` of a call
    bounds each attempt. Other status codes are the server's answer and are raised at once.

    Leader-only calls (:data:`LEADER_ONLY`) start at the leader when one is known; reads stay on
    the address that last answered. The returned call has ``ambiguous``: True when an attempt
    failed in a way that may have been processed (UNAVAILABLE without a leader hint: a dropped
    connection looks like that), so a caller can tell an answer to a retry of its own write.

    Server streams are opened on the address in use and are not retried here (what resuming
    means depends on the stream): a stream failing with UNAVAILABLE moves the channel to the next
    address or the named leader, so the caller's next call goes there.
    """

    def __init__(
        self,
        addresses: str | Iterable[str],
        factory: Callable[[str], grpc.aio.Channel],
        *,
        failover_timeout: float = DEFAULT_FAILOVER_TIMEOUT,
        backoff_initial: float = FAILOVER_BACKOFF_INITIAL,
        backoff_max: float = FAILOVER_BACKOFF_MAX,
    ) -> None:
        self.book = AddressBook(addresses, "address")
        self.failover_timeout = failover_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._factory = factory
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def current(self) -> str:
        """The address in use now."""
        return self.book.current

    def channel_to(self, address: str) -> grpc.aio.Channel:
        """The channel to one address (opened now if it is the first use)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._factory(address)
        return channel

    def note_failure(self, address: str, error: BaseException) -> None:
        """A call to ``address`` failed: on UNAVAILABLE, move to the named leader or the next
        address; any other code came from a live server, which stays in use."""
        if isinstance(error, grpc.aio.AioRpcError) and error.code() != grpc.StatusCode.UNAVAILABLE:
            self.book.answered(address)
        else:
            self.book.failed(address, error)

    async def close(self, grace: float | None = None) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(grace)

    async def __aenter__(self) -> FailoverChannel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.close(None)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.channel_to(self.current).get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self.channel_to(self.current).wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.channel_to(self.current).channel_ready()

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
        return _FailoverUnaryUnary(self, method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.UnaryStreamMultiCallable[Any, Any]:
        return _FailoverUnaryStream(self, method, request_serializer, response_deserializer)

    # Client streams (none in the Scheduler service; reflection's) go to the address in use.
    def stream_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.StreamUnaryMultiCallable[Any, Any]:
        return self.channel_to(self.current).stream_unary(
            method, request_serializer, response_deserializer
        )

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.aio.StreamStreamMultiCallable[Any, Any]:
        return self.channel_to(self.current).stream_stream(
            method, request_serializer, response_deserializer
        )


class _Method:
    def __init__(
        self,
        channel: FailoverChannel,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self.channel = channel
        self.method = method
        self.serializer = serializer
        self.deserializer = deserializer
        self.leader_only = method_name(method) in LEADER_ONLY


class _FailoverUnaryUnary(_Method, grpc.aio.UnaryUnaryMultiCallable[Any, Any]):
    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> FailoverUnaryCall:
        options = {
            "timeout": timeout,
            "metadata": metadata,
            "credentials": credentials,
            "wait_for_ready": wait_for_ready,
            "compression": compression,
        }
        return FailoverUnaryCall(self, request, options)


class FailoverUnaryCall(grpc.aio.UnaryUnaryCall[Any, Any]):
    """A unary call that moves between servers (see :class:`FailoverChannel`). ``address``: the
    server of the last attempt; ``ambiguous``: an earlier attempt may have been processed."""

    def __init__(self, method: _Method, request: Any, options: dict[str, Any]) -> None:
        self.ambiguous = False
        self._method = method
        self._request = request
        self._options = options
        self.address = method.channel.book.start(method.leader_only)
        self._inner = self._attempt(self.address)
        self._task = asyncio.ensure_future(self._run())

    def _attempt(self, address: str) -> grpc.aio.UnaryUnaryCall[Any, Any]:
        m = self._method
        multicallable = m.channel.channel_to(address).unary_unary(
            m.method, m.serializer, m.deserializer
        )
        return multicallable(self._request, **self._options)

    async def _run(self) -> Any:
        channel = self._method.channel
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay = channel.backoff_initial
        tried = {self.address}
        while True:
            try:
                reply = await self._inner
            except grpc.aio.AioRpcError as exc:
                channel.note_failure(self.address, exc)
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                if leader_hint(exc) is None:
                    # Maybe a connection dropped after the request left: it may have been done.
                    self.ambiguous = True
                following = channel.book.current
                # Jittered, so the clients of a failed leader do not all come back in step.
                pause = random.uniform(delay / 2, delay)
                if following in tried:
                    remaining = channel.failover_timeout - (loop.time() - started)
                    if remaining <= 0:
                        raise
                    pause = min(pause, remaining)  # the last try comes at the deadline
                tried.add(following)
                await asyncio.sleep(pause)
                delay = min(delay * 2, channel.backoff_max)
                self.address = following
                self._inner = self._attempt(following)
                continue
            channel.book.answered(self.address, leader=self._method.leader_only)
            return reply

    def __await__(self) -> Generator[Any, None, Any]:
        return self._task.__await__()

    async def _settled(self) -> None:
        await asyncio.wait([self._task])

    def cancelled(self) -> bool:
        return self._task.cancelled()

    def done(self) -> bool:
        return self._task.done()

    def time_remaining(self) -> float | None:
        return self._inner.time_remaining()

    def cancel(self) -> bool:
        if self._task.done():
            return False
        self._inner.cancel()
        return self._task.cancel()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._task.add_done_callback(lambda _task: callback(self))

    async def initial_metadata(self) -> grpc.aio.Metadata:
        await self._settled()
        return await self._inner.initial_metadata()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        await self._settled()
        return await self._inner.trailing_metadata()

    async def code(self) -> grpc.StatusCode:
        await self._settled()
        if self._task.cancelled():
            return grpc.StatusCode.CANCELLED
        error = self._task.exception()
        if error is None:
            return grpc.StatusCode.OK
        return error.code() if isinstance(error, grpc.aio.AioRpcError) else grpc.StatusCode.UNKNOWN

    async def details(self) -> str:
        await self._settled()
        error = None if self._task.cancelled() else self._task.exception()
        if isinstance(error, grpc.aio.AioRpcError):
            return error.details() or ""
        return "" if error is None else str(error)

    async def wait_for_connection(self) -> None:
        await self._inner.wait_for_connection()


class _FailoverUnaryStream(_Method, grpc.aio.UnaryStreamMultiCallable[Any, Any]):
    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> FailoverStreamCall:
        address = self.channel.book.start(self.leader_only)
        inner = self.channel.channel_to(address).unary_stream(
            self.method, self.serializer, self.deserializer
        )(
            request,
            timeout=timeout,
            metadata=metadata,
            credentials=credentials,
            wait_for_ready=wait_for_ready,
            compression=compression,
        )
        return FailoverStreamCall(self, address, inner)


class FailoverStreamCall(grpc.aio.UnaryStreamCall[Any, Any]):
    """A server stream on one address; its failure moves the channel on (see
    :class:`FailoverChannel`)."""

    def __init__(
        self, method: _Method, address: str, inner: grpc.aio.UnaryStreamCall[Any, Any]
    ) -> None:
        self._method = method
        self.address = address
        self._inner = inner
        self._answered = False

    def _received(self) -> None:
        if not self._answered:
            self._answered = True
            self._method.channel.book.answered(self.address, leader=self._method.leader_only)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        try:
            async for message in self._inner:
                self._received()
                yield message
        except grpc.aio.AioRpcError as exc:
            self._method.channel.note_failure(self.address, exc)
            raise

    async def read(self) -> Any:
        try:
            message = await self._inner.read()
        except grpc.aio.AioRpcError as exc:
            self._method.channel.note_failure(self.address, exc)
            raise
        if message is not grpc.aio.EOF:
            self._received()
        return message

    def cancelled(self) -> bool:
        return self._inner.cancelled()

    def done(self) -> bool:
        return self._inner.done()

    def time_remaining(self) -> float | None:
        return self._inner.time_remaining()

    def cancel(self) -> bool:
        return self._inner.cancel()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._inner.add_done_callback(lambda _call: callback(self))

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return await self._inner.initial_metadata()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return await self._inner.trailing_metadata()

    async def code(self) -> grpc.StatusCode:
        return await self._inner.code()

    async def details(self) -> str:
        return await self._inner.details()

    async def wait_for_connection(self) -> None:
        await self._inner.wait_for_connection()
