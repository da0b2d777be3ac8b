"""Collection: gathering a node's evidence into a bundle."""
