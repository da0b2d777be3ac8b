"""Bundles: the evidence tarball of one incident on one node (manifest, writer; the reader comes with report)."""
