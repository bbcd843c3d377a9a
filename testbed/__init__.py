"""The embedded WAN testbed (trace-driven link emulation). It arrives with the testbed issue;
until then runs go over loopback unshaped. `testbed` may import `wantrain`, never the reverse."""

__all__: list[str] = []
