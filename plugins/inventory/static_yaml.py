"""Inventory plugin ``static_yaml``: Ansible's ``yaml`` plugin, minus gpufleet node lists."""

from __future__ import annotations

from ansible.plugins.inventory.yaml import InventoryModule as YamlInventoryModule

DOCUMENTATION = r"""
    name: static_yaml
    short_description: Ansible's yaml inventory plugin, except for gpufleet node lists
    description:
        - Exactly the core C(yaml) inventory plugin (static YAML inventories), except that it
          leaves C(*.gpufleet.yml) and C(*.gpufleet.yaml) node lists to the C(gpufleet) plugin.
        - gpufleet's ansible.cfg enables it instead of C(yaml). Ansible lets every enabled
          plugin try a source and, when none succeeds, prints every plugin's failure; so a
          broken node list would show C(yaml)'s unrelated "Plugin configuration YAML file,
          not YAML inventory" next to gpufleet's one-line error.
    options:
      yaml_extensions:
        description: list of 'valid' extensions for files containing YAML
        type: list
        elements: string
        default: ['.yaml', '.yml', '.json']
        env:
          - name: ANSIBLE_YAML_FILENAME_EXT
          - name: ANSIBLE_INVENTORY_PLUGIN_EXTS
        ini:
          - key: yaml_valid_extensions
            section: defaults
          - section: inventory_plugin_yaml
            key: yaml_valid_extensions
"""

# The gpufleet plugin's files (gpufleet.nodelist.NODE_LIST_SUFFIXES; a test keeps them equal).
NODE_LIST_SUFFIXES = (".gpufleet.yml", ".gpufleet.yaml")


class InventoryModule(YamlInventoryModule):
    NAME = "static_yaml"

    def verify_file(self, path):
        return not str(path).endswith(NODE_LIST_SUFFIXES) and super().verify_file(path)
