"""gpufleet dashboards built with grafana-foundation-sdk; generate.py renders them."""
