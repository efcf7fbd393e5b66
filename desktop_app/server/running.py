"""`Server`: uvicorn over one `App`'s API until stopped, on the sockets it binds first;
`LocalAPI`: the same, as a window toggles it. See the package's docstring for what a server
does and never does."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence

import uvicorn

from store import DamagedError, DiskFullError, ReadOnlyError

from ..app import App
from ..errors import EngineError
from ..settings import Settings
from . import bridge, discovery
from .api import create_api

LOOPBACK = ("127.0.0.1", "::1", "localhost")
log = logging.getLogger("kvdesk.server")


class _Uvicorn(uvicorn.Server):
    """Stops the answers in flight at the first signal, before uvicorn waits for them."""

    def __init__(self, config: uvicorn.Config, stopping: bridge.Stopping):
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig, frame) -> None:
        self.stopping.stop()
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def stop_signals_handled(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and Ctrl-C call `stop`, from the model's load on, and never raise: a
    KeyboardInterrupt raised while llama.cpp loads the model lands in its log callback, which
    ctypes swallows (the server then started all the same). Once stopped by a signal, uvicorn
    raises it again under the handler it found: for SIGTERM the default one would kill the
    process there, before the server file is removed and with status 143; for Ctrl-C Python's
    raises KeyboardInterrupt ("Aborted.", 130). Under this, the server returns for both."""
    if threading.current_thread() is not threading.main_thread():
        yield  # uvicorn listens to signals only in the main thread
        return
    stops = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda sig, frame: stop()) for sig in stops}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


STRONG_KEY = 16  # characters: shorter, a key on the network is said to be guessable


def check_bind(host: str, api_key: str | None) -> None:
    """Any address but loopback needs an API key: the API reads documents and chats."""
    try:
        loopback = host in LOOPBACK or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if api_key and api_key != api_key.strip():  # (spaces only too; "": no key)
        raise EngineError("the API key is blank or begins or ends with a space, which no "
                          "client's key can match (a key sent is read without them): give "
                          "another (--api-key or KVDESK_API_KEY)")
    if not loopback and not api_key:
        raise EngineError(f"serving on {host} would open kvdesk to the network: give an API "
                          "key (--api-key) that every client must send, or bind 127.0.0.1")
    if not loopback and len(api_key) < STRONG_KEY:
        log.warning("the API key has only %d character(s): on %s anyone on the network "
                    "can try keys; a random key of %d or more (python -c \"import secrets; "
                    "print(secrets.token_urlsafe())\") cannot be guessed", len(api_key), host,
                    STRONG_KEY)


class Server:
    def __init__(self, app: App, *, host: str = "127.0.0.1", port: int = 8765,
                 api_key: str | None = None, ollama_port: int | None = None,
                 origins: Sequence[str] | None = None):
        check_bind(host, api_key)
        self.app, self.host, self.port, self.api_key = app, host, port, api_key
        self.ollama_port = ollama_port  # also listen there when free (None: not)
        self.ollama_url: str | None = None  # where it does, once it serves
        self.stopping = bridge.Stopping()
        config = uvicorn.Config(create_api(app, api_key=api_key, stopping=self.stopping,
                                           origins=origins),
                                host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=10)
        self.uvicorn = _Uvicorn(config, self.stopping)
        self.started = threading.Event()
        self._claim: int | None = None  # the data directory held (`discovery.claim`)
        self._socket: socket.socket | None = None  # the port held (`listen`)

    @property
    def url(self) -> str:
        return self._url(self.port)

    def _url(self, port: int) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{port}"

    def signals_stop(self) -> contextlib.AbstractContextManager[None]:
        """SIGTERM and Ctrl-C stop this server cleanly from here on (`run` returns), before
        and while the model loads as well as while it serves."""
        return stop_signals_handled(self.stopping.stop)

    def listen(self) -> None:
        """Hold the data directory (`check`) and bind the port, before the model loads: a
        directory served or a port in use is refused at once (EngineError), and the socket
        bound here is the one served, so nothing can take the port in between."""
        if self._socket is not None:
            return
        self.check()
        try:
            self._socket = bind(self.host, self.port)
        except BaseException:
            self._release()
            raise
        self.port = self._socket.getsockname()[1]  # port 0: a free one, named in the server file
        self.uvicorn.config.port = self.port

    def run(self) -> None:
        """Serve until stopped (a signal in the main thread, or stop()); blocks."""
        self.listen()  # (done already where the command line said it before loading)
        sockets = [self._socket]
        try:
            with stop_signals_handled(self.stopping.stop):
                if self.stopping.event.is_set():
                    return  # stopped before it began (`Server.signals_stop`)
                self.app.engine.warm_up()  # the model and the codec, before any request
                self.app.engine.contexts.wait_warm(self.stopping.event)
                if self.stopping.event.is_set():
                    return  # stopped while it loaded: never served
                if self.ollama_port is not None and self.ollama_port != self.port:
                    sockets += filter(None, [spare(self.host, self.ollama_port)])
                if len(sockets) > 1:
                    self.ollama_url = self._url(sockets[1].getsockname()[1])
                threading.Thread(target=self._announce, daemon=True).start()
                self.uvicorn.run(sockets=sockets)
        finally:
            self.stopping.stop()
            discovery.remove(self.app.data_dir)
            for sock in sockets:
                sock.close()
            self._release()

    def _release(self) -> None:
        """Let go of the port and the data directory held."""
        if self._socket is not None:
            self._socket.close()
        if self._claim is not None and self._claim >= 0:
            os.close(self._claim)
        self._socket = self._claim = None

    def check(self) -> None:
        """Raise EngineError when this data directory cannot be served: another server serves
        it, or it is read-only or damaged (before the model loads: nothing to wait for)."""
        running = discovery.live(self.app.data_dir)
        if running:
            raise EngineError(f"a kvdesk server already serves this data directory at "
                              f"{running}: stop it first, or use it")
        try:
            self.app.store.check_writable()
        except (DamagedError, DiskFullError):
            raise  # (each says what to do)
        except ReadOnlyError:
            raise EngineError(f"the data directory {self.app.data_dir} is read-only: a "
                              "server stores chats and caches there (`kvdesk docs`, `chats` "
                              "and `verify` read it as it is)") from None
        if self._claim is None:  # (held from here until the server stops)
            self._claim = discovery.claim(self.app.data_dir)
            if self._claim is None:
                raise EngineError("a kvdesk server is starting on this data directory (it "
                                  f"holds {discovery.LOCK}): wait for it and use it, or stop "
                                  "it first")

    def stop(self) -> None:
        self.stopping.stop()
        self.uvicorn.should_exit = True

    def _announce(self) -> None:
        while not self.uvicorn.started and not self.uvicorn.should_exit:
            threading.Event().wait(0.02)
        if self.uvicorn.started:
            try:
                discovery.write(self.app.data_dir, self.url, self.api_key)
            except OSError as e:  # it serves all the same; commands just do not find it
                log.warning("could not write %s (%s): kvdesk commands will not use this "
                            "server", discovery.FILE, e.strerror or e)
            log.info("serving on %s", self.url)
            self.started.set()


class LocalAPI:
    """The local API as a window runs it: started and stopped at will (the settings' toggle),
    in a thread of the app's own process, over the app's own engine."""

    def __init__(self, app: App):
        self.app = app
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str | None:
        return self._server.url + "/v1" if self._server is not None else None

    def start(self, settings: Settings) -> str:
        """Serve on 127.0.0.1 as the settings say (their port, Ollama's port, the web pages
        allowed: the window's settings, which may be newer than the engine's); blocks until it
        serves; its base URL."""
        self.stop()
        server = Server(self.app, port=settings.server_port, ollama_port=settings.ollama_port,
                        origins=settings.cors_origins)
        failed: list[BaseException] = []

        def run() -> None:
            try:
                server.run()
            except BaseException as e:  # noqa: BLE001 - reported to the caller below
                failed.append(e)
                server.started.set()

        self._thread = threading.Thread(target=run, name="kvdesk-local-api", daemon=True)
        self._thread.start()
        server.started.wait()
        if failed:
            raise failed[0]
        self._server = server
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._thread.join(30)
            self._server = self._thread = None


# The sockets: binding them before uvicorn starts gives a clear error for a port in use (not
# uvicorn's exit later) and lets port 0 pick a free port that the server file can name.
# Ollama's clients look for it on port 11434 (the setting `ollama_port`): when that port is
# free, the server listens there too, the same API on both; when it is taken (by Ollama
# itself, most likely), the server runs without it and says so, and Ollama's API stays on the
# server's own port under /api.


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port; EngineError naming the port if it cannot be."""
    try:
        return _bound(host, port)
    except OSError as e:
        raise EngineError(f"cannot serve on {host}:{port} ({e.strerror}): choose another "
                          "--port or --host") from None


def spare(host: str, port: int) -> socket.socket | None:
    """A socket bound to host:port if it is free, else None (said in the log)."""
    try:
        return _bound(host, port)
    except OSError as e:
        log.warning("Ollama's port %s is not free (%s; Ollama itself?): Ollama's clients can "
                    "use this server's own port", port, e.strerror)
        return None


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening at once makes the port this process's: SO_REUSEADDR would let a second
        # process bind it too until the first listens, after its model has loaded.
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock
