"""Language-model backbones: prepare one as a local directory (`backbone.prepare_backbone`) and load it back."""
