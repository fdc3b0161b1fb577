"""Where a cluster lives and how its daemons find each other: the workdir layout, the records of
where daemons answer, the advertised address, the service registry, and reaching the store and a
remote master from a command."""
