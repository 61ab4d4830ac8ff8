"""The agent's loops: commands from metadata, health to guest attributes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from provisioner.agent.config import AgentConfig
from provisioner.agent.gpu import Gpus, GpuSample
from provisioner.agent.guest import GuestWriter
from provisioner.agent.health import assess
from provisioner.agent.host import Host
from provisioner.agent.metadata import Metadata, MetadataError
from provisioner.agent.notebook import Notebooks
from provisioner.agent.runtime import Runtime
from provisioner.agent.usage import Usage, collect
from provisioner.common.clock import Clock

log = logging.getLogger(__name__)

COMMAND_KEY = "provisioner-command"
# What Compute Engine tells the VM ahead of host maintenance, and a Spot VM when it is preempted.
MAINTENANCE_EVENT, PREEMPTED = "instance/maintenance-event", "instance/preempted"


class DoneIds:
    """The result of every finished command, by id, in a small JSON file: a restarted agent
    reports a command it already ran instead of running it again. The newest `keep` are kept."""

    def __init__(self, path: Path, keep: int = 64):
        self.path, self.keep = path, keep
        try:
            self._done: dict[str, str] = json.loads(path.read_text())
        except FileNotFoundError:
            self._done = {}

    def get(self, cid: str) -> str | None:
        return self._done.get(cid)

    def put(self, cid: str, result: str) -> None:
        self._done[cid] = result
        self._done = dict(list(self._done.items())[-self.keep:])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w") as f:
            json.dump(self._done, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Agent:
    def __init__(self, cfg: AgentConfig, metadata: Metadata, runtime: Runtime, gpus: Gpus, host: Host,
                 clock: Clock, done: DoneIds):
        self.cfg, self.metadata, self.runtime, self.gpus, self.host = cfg, metadata, runtime, gpus, host
        self.notebooks = Notebooks(cfg, runtime, host, gpus, metadata, clock)
        self.clock, self.done = clock, done
        self._current = ""  # the command being run (or last run)
        self._ask = 0  # how many times the cluster has asked for it again (its answer was lost)
        self.guest = GuestWriter(metadata, clock, cfg.guest_writes_per_minute)
        self._task: asyncio.Task | None = None
        self._asked: dict[str, asyncio.Task] = {}  # commands that said `asked-<id>`: the write of it
        self._reported: list[str] = []  # commands whose attributes are on the metadata server
        self._hardware: list[str] = []  # XID and ECC faults: they stay once seen

    async def run(self) -> None:
        try:
            self.gpus.start()
        except Exception as err:  # no driver, no GPU: every health check will say so
            log.error("NVML did not start: %s", err)
        await self.check_health()
        await self.put("ready", "1")
        log.info("agent ready")
        await asyncio.gather(self._watch(), self._health_loop(), self.guest.run(),
                             self._watch_value(MAINTENANCE_EVENT, "maintenance", "NONE"),
                             self._watch_value(PREEMPTED, "preempted", "FALSE"))

    # ---- guest attributes ----------------------------------------------------------------

    async def put(self, key: str, value: str, only_if_changed: bool = False, urgent: bool = True) -> None:
        """Writes one guest attribute within the VM's write rate (see GuestWriter): `urgent` ones
        as soon as the rate allows, the others coalesced."""
        await self.guest.put(key, value, urgent=urgent, only_if_changed=only_if_changed)

    async def _watch_value(self, path: str, key: str, normal: str) -> None:
        """Follows one metadata value (wait-for-change) and reports it once it is not `normal`:
        host maintenance ahead, or a Spot preemption under way. The cluster ends the session
        with that reason instead of finding its processes gone after the VM comes back."""
        etag, delay, reported = "", 0.5, False
        while True:
            try:
                value, new = await self.metadata.value(path, etag, self.cfg.watch_timeout_s)
            except MetadataError as err:
                log.warning("reading %s failed (%s); retrying", path, err)
                await self.clock.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay, value = 0.5, value.strip() or normal
            if new != etag:
                etag = new
                if value != normal or reported:  # nothing to say while all is normal
                    log.warning("%s: %s", path, value)
                    await self.put(key, value, only_if_changed=True)
                    reported = True

    # ---- commands ------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Follows the instance's metadata with wait-for-change: one request held open at a time."""
        etag, delay = "", 0.5
        while True:
            try:
                attrs, new = await self.metadata.attributes(etag, self.cfg.watch_timeout_s)
            except MetadataError as err:
                log.warning("reading metadata failed (%s); retrying", err)
                await self.clock.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay = 0.5
            if new == etag:
                continue  # the wait timed out unchanged
            etag = new
            if raw := attrs.get(COMMAND_KEY):
                try:
                    command = json.loads(raw)
                    command["id"], command["op"]
                except (ValueError, KeyError, TypeError):
                    log.error("ignoring a malformed command: %.200s", raw)
                    continue
                self.on_command(command)

    def on_command(self, command: dict) -> None:
        """Runs a new command once; a new one supersedes the one under way."""
        cid, ask = command["id"], command.get("ask", 0)
        if cid == self._current:
            # Asked again: the answer written was lost (guest attributes beyond the rate may be), or
            # the command is still at work with nothing to report (a wipe, a layer being unpacked):
            # `asked-<id>` tells the cluster it is, so the silence is not taken for a lost answer.
            if ask != self._ask and self._task is not None and self._task.done() and self.done.get(cid):
                self._task = asyncio.create_task(self._report(cid, self.done.get(cid), None))
            elif ask != self._ask and self._task is not None and not self._task.done():
                self._asked[cid] = asyncio.create_task(self.put(f"asked-{cid}", str(ask)))
            self._ask = ask
            return
        previous, self._current, self._ask = self._task, cid, ask
        if previous is not None and not previous.done():
            previous.cancel()
        if (result := self.done.get(cid)) is not None:  # ran before this agent restarted
            self._task = asyncio.create_task(self._report(cid, result, previous))
        else:
            self._task = asyncio.create_task(self._run(command, previous))

    async def _report(self, cid: str, result: str, previous: asyncio.Task | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        await self.put(f"done-{cid}", result)

    async def _run(self, command: dict, previous: asyncio.Task | None) -> None:
        cid, op = command["id"], command["op"]
        try:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)  # it reports its own end first
            await self._forget_old(cid)
            log.info("command %s: %s", cid, op)
            if op == "pull":
                result = await self.pull(cid, command)
            elif op == "start":
                # The host port rides in the answer: one write, which the cluster reads whole.
                result = f"ok {(await self.notebooks.start(command)).host_port}"
            elif op == "stop":
                await self.notebooks.stop(str(command["session_id"]))
                result = "ok"
            elif op == "wipe":
                result = await self.notebooks.wipe()
            else:
                result = f"error: unknown op {op!r}"
        except asyncio.CancelledError:
            result = f"error: superseded by command {self._current}"
        except Exception as err:  # a failed command is reported, never the agent's end
            log.exception("command %s failed", cid)
            result = f"error: {type(err).__name__}: {err}"
        self.done.put(cid, result)
        await self.put(f"done-{cid}", result)
        log.info("command %s: %s", cid, result)

    async def _forget_old(self, cid: str) -> None:
        """Keeps the attributes of the last command and this one (a namespace holds at most 100)."""
        for old in self._reported[:-1]:
            asked = (f"asked-{old}",) if self._asked.pop(old, None) else ()
            for key in (f"progress-{old}", f"done-{old}", *asked):
                self.guest.delete(key)
        self._reported = self._reported[-1:] + [cid]

    async def pull(self, cid: str, command: dict) -> str:
        """Pulls the command's image, reporting bytes done and an estimate of the time left."""
        total = int(command.get("bytes") or sum(int(layer["bytes"]) for layer in command.get("layers", [])))
        progress = _Progress(self, cid, total)
        reporter = asyncio.create_task(progress.loop())
        try:
            await self.notebooks.pull(command, progress.set)
        finally:
            reporter.cancel()
        progress.set(total)
        await progress.write()
        return "ok"

    # ---- health --------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await self.clock.sleep(self.cfg.health_s)
            try:
                await self.check_health()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("health check failed; continuing")

    async def check_health(self) -> list[str]:
        """Samples the GPUs and disks and writes what changed: detail before verdict, so a
        reader that sees `healthy` 0 finds the reason beside it; then what the session runs."""
        try:
            samples = self.gpus.sample()
        except Exception as err:
            samples, faults = [], [f"NVML: {err}"]
        else:
            faults = []
        disks = {p: self.host.disk(p) for p in self.cfg.disk_paths}
        now_faults = assess(samples, disks, self.cfg)
        # A hardware error is an event: once seen, the GPU stays suspect.
        self._hardware += [f for f in now_faults if ("XID" in f or "ECC" in f) and f not in self._hardware]
        faults += self._hardware + [f for f in now_faults if f not in self._hardware]
        await self.put("health-detail", "; ".join(faults), only_if_changed=True)
        await self.put("healthy", "0" if faults else "1", only_if_changed=True)
        await self.put("usage", self.usage(samples).to_json(), only_if_changed=True, urgent=False)
        if faults:
            log.warning("unhealthy: %s", "; ".join(faults))
        return faults

    def usage(self, samples: list[GpuSample]) -> Usage:
        """What the session runs, for abuse detection: GPU use, its processes, where they connect."""
        procs = self.host.user_processes(self.cfg.user_uid_min)
        return collect([g.utilization_pct for g in samples], [n for g in samples for n in g.processes],
                       [p.name for p in procs], self.host.connections([p.pid for p in procs]))


class _Progress:
    """A pull's progress, offered every progress_s (written as the VM's write rate allows, the
    latest value only): `progress-<id>` is "<bytes done> <estimated seconds left>"."""

    def __init__(self, agent: Agent, cid: str, total: int):
        self.agent, self.cid, self.total = agent, cid, total
        self.started = agent.clock.now()
        self.bytes = 0

    def set(self, nbytes: int) -> None:
        self.bytes = nbytes

    async def loop(self) -> None:
        while True:
            await self.write()
            await self.agent.clock.sleep(self.agent.cfg.progress_s)

    async def write(self) -> None:
        elapsed = self.agent.clock.now() - self.started
        left = self.total - self.bytes
        eta = left * elapsed / self.bytes if self.bytes and left else 0.0
        await self.agent.put(f"progress-{self.cid}", f"{self.bytes} {eta:.0f}", only_if_changed=True, urgent=False)
