"""What init_process_group found: its time and collie.get_topology(), on
rank 0 (docs/multihost.md, "Measured at setup"):

    collie testbed --hosts 2 -n 2 --rate 1gbit docs/perf/multihost/topology.py
    COLLIE_LINK_PROBE=0 collie testbed --hosts 2 -n 2 --rate 1gbit docs/perf/multihost/topology.py
"""
import time

import collie

t = time.perf_counter()
collie.init_process_group()
t = time.perf_counter() - t
if collie.get_rank() == 0:
    d = collie.get_topology()
    link = d["link"]
    print(f"init {t:.3f}s hosts {d['hosts']} ({d['source']}) link "
          + (f"{link['rate_bytes_per_s'] / 1e6:.1f} MB/s {link['latency_s'] * 1e6:.0f} us" if link else "none")
          + f" ({d['link_source']})")
collie.destroy_process_group()
