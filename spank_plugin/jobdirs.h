/*
 * jobdirs.h - a job's own directory under a shared root, made and removed safely.
 *
 * No Slurm here: the plugin (auto_resume.c) calls these as root in slurmstepd and in
 * the job epilog, and test/check.c calls them on scratch directories.  Every path is
 * walked from "/" one component at a time with O_NOFOLLOW, and everything below the
 * root is reached relative to a descriptor: nothing is followed, nothing is looked up
 * twice by name where a descriptor would do.
 */
#ifndef AR_JOBDIRS_H
#define AR_JOBDIRS_H

#include <stddef.h>
#include <sys/types.h>

enum jd_result {
	JD_OK,		/* the job's directory (made, kept, or removed) */
	JD_KEPT,	/* removal: not empty, left for its owner */
	JD_REFUSED,	/* not the job's to use: another owner, a link, open to others */
	JD_ERROR,	/* a system call failed; nothing was left half made */
};

/*
 * A descriptor of the directory <root>, or -1 with the reason in why (errno ENOENT
 * when a component is missing).  <root> and every directory above it must be real
 * directories owned by root and, if others may write them, sticky (like /tmp).  With
 * create_mode != 0 a missing last component is made, owned by root with that mode
 * (its parent must exist).
 */
int jd_open_root(const char *root, mode_t create_mode, char *why, size_t len);

/*
 * <root_fd>/<name> for the job's user: made mode 0700 and handed to uid:gid, or kept
 * if it is already theirs and nobody else may write in it.  Anything else (another
 * owner, a symbolic link, not a directory, open to others' writes) is JD_REFUSED and
 * left exactly as it is.  A root-owned, empty, private directory is one that another
 * step of the same job is making right now: it is finished the same way.
 */
enum jd_result jd_ensure(int root_fd, const char *name, uid_t uid, gid_t gid,
			 char *why, size_t len);

/* 1 if <root_fd>/<name> exists (a symbolic link counts; nothing is followed). */
int jd_exists(int root_fd, const char *name);

#define JD_MAX_DEPTH 64	/* a removal leaves a deeper tree in place (bounded recursion) */

/*
 * Remove <root_fd>/<name> if it is a directory owned by uid (anything else is
 * JD_REFUSED and left alone; a missing one is JD_OK).  recursive: with everything in
 * it, by a child process running as that user, so the kernel checks every removal
 * as it would the user's own; else only if it is empty (JD_KEPT otherwise).
 */
enum jd_result jd_remove(int root_fd, const char *name, uid_t uid, int recursive,
			 char *why, size_t len);

#endif
