"""Deployment: topology description, local cluster runner, compose file and HAProxy config."""
