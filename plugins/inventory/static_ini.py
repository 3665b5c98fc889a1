"""Inventory plugin ``static_ini``: Ansible's ``ini`` plugin, minus gpufleet node lists."""

from __future__ import annotations

from ansible.plugins.inventory.ini import InventoryModule as IniInventoryModule

DOCUMENTATION = r"""
    name: static_ini
    short_description: Ansible's ini inventory plugin, except for gpufleet node lists
    description:
        - Exactly the core C(ini) inventory plugin (static INI inventories), except that it
          leaves C(*.gpufleet.yml) and C(*.gpufleet.yaml) node lists to the C(gpufleet) plugin.
        - gpufleet's ansible.cfg enables it instead of C(ini), which tries every file and,
          for a broken node list, would print an unrelated "Invalid host pattern 'plugin:'"
          next to gpufleet's one-line error.
"""

# The gpufleet plugin's files (gpufleet.nodelist.NODE_LIST_SUFFIXES; a test keeps them equal).
NODE_LIST_SUFFIXES = (".gpufleet.yml", ".gpufleet.yaml")


class InventoryModule(IniInventoryModule):
    NAME = "static_ini"

    def verify_file(self, path):
        return not str(path).endswith(NODE_LIST_SUFFIXES) and super().verify_file(path)
