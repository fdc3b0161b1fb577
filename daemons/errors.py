"""Errors of the daemons room (codes -1000..-1099)."""

from __future__ import annotations

from transfer.errors import MooncakeError


class ClusterAlreadyRunning(MooncakeError):
    code, name = -1000, "CLUSTER_ALREADY_RUNNING"


class ClusterNotRunning(MooncakeError):
    code, name = -1001, "CLUSTER_NOT_RUNNING"


class DaemonStartFailed(MooncakeError):
    code, name = -1002, "DAEMON_START_FAILED"

    def __init__(self, daemon: str, reason: str = "", log_tail: str = "") -> None:
        self.daemon, self.reason, self.log_tail = daemon, reason, log_tail
        super().__init__(f"daemon '{daemon}' failed to start: {reason}")


class AddressNotReachable(MooncakeError):
    code, name = -1003, "ADDRESS_NOT_REACHABLE"


class ServiceNotRegistered(MooncakeError):
    code, name = -1004, "SERVICE_NOT_REGISTERED"


class WorkdirUnusable(MooncakeError):
    code, name = -1005, "WORKDIR_UNUSABLE"


class ProgramMissing(MooncakeError):
    """An external program a command runs (etcd for `bench failover`) is not installed."""
    code, name = -1006, "PROGRAM_MISSING"

    def __init__(self, program: str, package: str) -> None:
        self.program, self.package = program, package
        super().__init__(f"{program} is not installed (Debian: apt-get install {package})")


class MetadataServerUnavailable(MooncakeError):
    """The HTTP metadata server a master was asked to run beside it could not bind its address."""
    code, name = -1007, "METADATA_SERVER_UNAVAILABLE"


class BenchHostsFailed(MooncakeError):
    """`bench serve --hosts` could not build its namespaces or run its cluster in them."""
    code, name = -1008, "BENCH_HOSTS_FAILED"
