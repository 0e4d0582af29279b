"""gpulint's rules, one per file, installed as `gpulint.rules`. Import them only as `gpulint.rules.<name>`."""
