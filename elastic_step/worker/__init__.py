"""Workers: take tasks from the master, compute gradients, and push them to the PS."""
