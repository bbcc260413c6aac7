/*
 * jobdirs.c - a job's own directory under a shared root (see jobdirs.h).
 *
 * The roots are shared by every user of a node (mode 1777, like /tmp), so a user can
 * create any name in them first, including the name of someone else's next job.  Such
 * an entry is never used, chowned, moved or removed here: the job goes on without it.
 * What we make is made by root (mkdirat), then handed to the job's user through the
 * descriptor we opened (fchown, fchmod), so it is never the user's before it is private.
 */
#include "jobdirs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define JD_OPEN_DIR (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define JD_EXIT_CREDS 254	/* the remover could not become the user */

static void jd_say(char *why, size_t len, const char *fmt, ...)
	__attribute__ ((format (printf, 3, 4)));

static void jd_say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

static unsigned jd_mode(const struct stat *st)
{
	return (unsigned) (st->st_mode & 07777);
}

static int jd_replaceable(const struct stat *st)
{
	return (st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX);
}

/* The first n bytes of root name a directory we hold: is it root's, and safe? */
static int jd_check_root_dir(int fd, const char *root, int n, char *why, size_t len)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		jd_say(why, len, "stat %.*s: %s", n, root, strerror(errno));
		return -1;
	}
	if (st.st_uid != 0) {
		jd_say(why, len, "%.*s belongs to uid %u, not root", n, root,
		       (unsigned) st.st_uid);
		errno = EPERM;
		return -1;
	}
	if (jd_replaceable(&st)) {
		jd_say(why, len, "%.*s is writable by others without the sticky bit "
		       "(mode %04o)", n, root, jd_mode(&st));
		errno = EPERM;
		return -1;
	}
	return 0;
}

/* Opening <dir_fd>/<name> as a directory failed with err: was it a link? (O_NOFOLLOW
 * with O_DIRECTORY fails a symbolic link with ENOTDIR, not ELOOP.) */
static int jd_is_link(int dir_fd, const char *name, int err)
{
	struct stat st;

	return err == ELOOP || (err == ENOTDIR &&
		fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode));
}

static void jd_open_failed(int dir_fd, const char *name, const char *root, int n, int err,
			   char *why, size_t len)
{
	if (jd_is_link(dir_fd, name, err))
		jd_say(why, len, "%.*s is a symbolic link; not following it", n, root);
	else if (err == ENOTDIR)
		jd_say(why, len, "%.*s is not a directory", n, root);
	else
		jd_say(why, len, "open %.*s: %s", n, root, strerror(err));
	errno = err;
}

int jd_open_root(const char *root, mode_t create_mode, char *why, size_t len)
{
	const char *p = root, *end;
	char comp[NAME_MAX + 1];
	struct stat st;
	int fd, nfd, err;

	if (root[0] != '/') {
		errno = EINVAL;
		jd_say(why, len, "%s: not an absolute path", root);
		return -1;
	}
	if ((fd = open("/", JD_OPEN_DIR)) < 0) {
		jd_say(why, len, "open /: %s", strerror(errno));
		return -1;
	}
	if (jd_check_root_dir(fd, root, 1, why, len))
		goto fail;
	for (;;) {
		size_t n;
		int last, made = 0;

		p += strspn(p, "/");
		if (!*p)
			break;
		end = strchr(p, '/');
		if (!end)
			end = p + strlen(p);
		n = (size_t) (end - p);
		if (n > NAME_MAX) {
			jd_say(why, len, "%.*s: name too long", (int) (end - root), root);
			errno = ENAMETOOLONG;
			goto fail;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		last = end[strspn(end, "/")] == '\0';
		nfd = openat(fd, comp, JD_OPEN_DIR);
		if (nfd < 0 && errno == ENOENT && last && create_mode) {
			if (mkdirat(fd, comp, 0700) == 0)
				made = 1;
			else if (errno != EEXIST) {
				jd_say(why, len, "make %s: %s", root, strerror(errno));
				goto fail;
			}
			nfd = openat(fd, comp, JD_OPEN_DIR);
		}
		if (nfd < 0) {
			jd_open_failed(fd, comp, root, (int) (end - root), errno, why,
				       len);
			goto fail;
		}
		close(fd);
		fd = nfd;
		/* mkdir's mode passes through the umask; the descriptor's is exact */
		if (made && fstat(fd, &st) == 0 && st.st_uid == 0 &&
		    fchmod(fd, create_mode) < 0) {
			jd_say(why, len, "chmod %s: %s", root, strerror(errno));
			goto fail;
		}
		if (jd_check_root_dir(fd, root, (int) (end - root), why, len))
			goto fail;
		p = end;
	}
	return fd;

fail:
	err = errno;
	close(fd);
	errno = err;
	return -1;
}

/* 1 if the directory fd holds nothing, 0 if it holds something, -1 on error. */
static int jd_empty(int fd)
{
	struct dirent *e;
	DIR *d;
	int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0), empty = 1;

	if (copy < 0)
		return -1;
	if (!(d = fdopendir(copy))) {
		close(copy);
		return -1;
	}
	errno = 0;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			empty = 0;
			break;
		}
	}
	if (empty && errno)
		empty = -1;
	closedir(d);
	return empty;
}

static enum jd_result jd_not_ours(int dir_fd, const char *name, int err, char *why,
				  size_t len)
{
	if (jd_is_link(dir_fd, name, err))
		jd_say(why, len, "a symbolic link");
	else if (err == ENOTDIR)
		jd_say(why, len, "not a directory");
	else {
		jd_say(why, len, "open: %s", strerror(err));
		return JD_ERROR;
	}
	return JD_REFUSED;
}

enum jd_result jd_ensure(int root_fd, const char *name, uid_t uid, gid_t gid,
			 char *why, size_t len)
{
	struct stat st;
	int tries, fd = -1, made = 0;

	for (tries = 0; tries < 3; tries++) {
		if (mkdirat(root_fd, name, 0700) == 0)
			made = 1;
		else if (errno != EEXIST) {
			jd_say(why, len, "mkdir: %s", strerror(errno));
			return JD_ERROR;
		}
		if ((fd = openat(root_fd, name, JD_OPEN_DIR)) >= 0)
			break;
		if (errno != ENOENT)	/* ENOENT: its owner removed it meanwhile */
			return jd_not_ours(root_fd, name, errno, why, len);
	}
	if (fd < 0) {	/* someone keeps making and removing it: not ours to use */
		jd_say(why, len, "someone keeps removing and making it");
		return JD_REFUSED;
	}
	if (fstat(fd, &st) < 0) {
		jd_say(why, len, "stat: %s", strerror(errno));
		goto error;
	}
	if (made && st.st_uid != 0 && st.st_uid != uid) {
		/* ours, but the file system made it someone else's (root squashed) */
		jd_say(why, len, "made it, but the file system gives it to uid %u",
		       (unsigned) st.st_uid);
		(void) unlinkat(root_fd, name, AT_REMOVEDIR);
		goto error;
	}
	if (st.st_uid == uid) {
		if (st.st_mode & (S_IWGRP | S_IWOTH)) {
			jd_say(why, len, "others may write in it (mode %04o)", jd_mode(&st));
			goto refused;
		}
		if (uid != 0 || !made) {
			close(fd);
			return JD_OK;	/* the job's already: another step, an earlier run */
		}
	} else if (st.st_uid != 0) {
		jd_say(why, len, "belongs to uid %u, not to the job's user (uid %u)",
		       (unsigned) st.st_uid, (unsigned) uid);
		goto refused;
	} else if (st.st_mode & 077) {
		/* Root's: ours just now, or another step of this job making it (only root
		 * makes root-owned entries here).  Anything else of root's is not ours. */
		jd_say(why, len, "belongs to root with mode %04o", jd_mode(&st));
		goto refused;
	} else if (!made && jd_empty(fd) != 1) {
		jd_say(why, len, "belongs to root and is not empty");
		goto refused;
	}
	if (fchown(fd, uid, gid) < 0 || fchmod(fd, 0700) < 0) {
		jd_say(why, len, "hand it to uid %u: %s", (unsigned) uid, strerror(errno));
		/* never leave a directory we made but could not give away (root-squashed
		 * NFS makes it nobody's): the job's library may make its own instead */
		if (made)
			(void) unlinkat(root_fd, name, AT_REMOVEDIR);
		goto error;
	}
	close(fd);
	return JD_OK;

refused:
	close(fd);
	return JD_REFUSED;
error:
	close(fd);
	return JD_ERROR;
}

int jd_exists(int root_fd, const char *name)
{
	struct stat st;

	return fstatat(root_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT;
}

/* Empty the directory dir_fd (never following a link); the first errno, or 0. */
static int jd_clear(int dir_fd, int depth)
{
	struct dirent *e;
	DIR *d;
	int copy = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0), first = 0;

	if (copy < 0)
		return errno;
	if (!(d = fdopendir(copy))) {
		first = errno;
		close(copy);
		return first;
	}
	for (;;) {
		int sub, err;

		errno = 0;
		if (!(e = readdir(d))) {
			if (errno && !first)
				first = errno;
			break;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (unlinkat(dir_fd, e->d_name, 0) == 0)
			continue;
		if (errno != EISDIR) {
			first = first ? first : errno;
			continue;
		}
		if (depth >= JD_MAX_DEPTH) {
			first = first ? first : ENOTEMPTY;
			continue;
		}
		if ((sub = openat(dir_fd, e->d_name, JD_OPEN_DIR)) < 0) {
			first = first ? first : errno;
			continue;
		}
		err = jd_clear(sub, depth + 1);
		close(sub);
		if (err)
			first = first ? first : err;
		else if (unlinkat(dir_fd, e->d_name, AT_REMOVEDIR) < 0)
			first = first ? first : errno;
	}
	closedir(d);
	return first;
}

/* In a child running as uid:gid: empty fd, then remove <root_fd>/<name>. */
static enum jd_result jd_remove_as(int fd, int root_fd, const char *name, uid_t uid,
				   gid_t gid, char *why, size_t len)
{
	int status, err;
	pid_t pid = fork();

	if (pid < 0) {
		jd_say(why, len, "fork: %s", strerror(errno));
		return JD_ERROR;
	}
	if (pid == 0) {
		if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0 ||
		    (uid != 0 && (setuid(0) == 0 || geteuid() != uid)))
			_exit(JD_EXIT_CREDS);
		err = jd_clear(fd, 0);
		if (!err && unlinkat(root_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
			err = errno;
		_exit(err > 0 && err < JD_EXIT_CREDS ? err : (err ? 255 : 0));
	}
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			jd_say(why, len, "wait for the remover: %s", strerror(errno));
			return JD_ERROR;
		}
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return JD_OK;
	if (WIFEXITED(status) && WEXITSTATUS(status) == JD_EXIT_CREDS)
		jd_say(why, len, "couldn't become uid %u to remove it", (unsigned) uid);
	else if (WIFEXITED(status) && WEXITSTATUS(status) != 255)
		jd_say(why, len, "remove as uid %u: %s", (unsigned) uid,
		       strerror(WEXITSTATUS(status)));
	else
		jd_say(why, len, "the remover failed (status %d)", status);
	return JD_ERROR;
}

enum jd_result jd_remove(int root_fd, const char *name, uid_t uid, int recursive,
			 char *why, size_t len)
{
	struct stat st;
	enum jd_result r;
	int fd = openat(root_fd, name, JD_OPEN_DIR);

	if (fd < 0) {
		if (errno == ENOENT)
			return JD_OK;
		return jd_not_ours(root_fd, name, errno, why, len);
	}
	if (fstat(fd, &st) < 0) {
		jd_say(why, len, "stat: %s", strerror(errno));
		close(fd);
		return JD_ERROR;
	}
	if (st.st_uid != uid) {
		jd_say(why, len, "belongs to uid %u, not to the job's user (uid %u)",
		       (unsigned) st.st_uid, (unsigned) uid);
		close(fd);
		return JD_REFUSED;
	}
	if (recursive) {
		/* the directory's group is the job's, or one its user chose and is in */
		r = jd_remove_as(fd, root_fd, name, uid, st.st_gid, why, len);
		close(fd);
		return r;
	}
	close(fd);
	if (unlinkat(root_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
		return JD_OK;
	if (errno == ENOTEMPTY || errno == EEXIST)
		return JD_KEPT;
	jd_say(why, len, "rmdir: %s", strerror(errno));
	return JD_ERROR;
}
