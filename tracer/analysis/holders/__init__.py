"""Who held memory at a moment: live blocks, stacks, frames and the flame graph's tree, and the view's queries."""
