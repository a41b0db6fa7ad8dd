package launch

// ProcessOptions returns p: the process options of every config that
// embeds Process, for code that handles the roles' configs alike.
func (p Process) ProcessOptions() Process { return p }
