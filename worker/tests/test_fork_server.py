"""What a fork server does between requests with its own /dev/shm (fork_server.py): it empties it
only where the sandbox mounted a tmpfs for it alone, and leaves nothing a candidate could hide."""
import os
import stat

from kz_worker import fork_server

HOST_SHM = "29 24 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,size=24576k\n"
OWN_SHM = "612 29 0:98 / /dev/shm rw,nosuid,nodev,relatime - tmpfs kz-tmpfs rw,size=1048576k,mode=1777\n"
ROOT = "23 1 252:0 / / ro,relatime - ext4 /dev/vda rw\n"


def test_only_the_sandboxs_own_tmpfs_counts_as_the_servers_own():
    assert fork_server.mounted_own_tmpfs(ROOT + HOST_SHM + OWN_SHM, "/dev/shm") == os.makedev(0, 98)
    assert fork_server.mounted_own_tmpfs(ROOT + HOST_SHM, "/dev/shm") is None  # the host's: never emptied
    assert fork_server.mounted_own_tmpfs(ROOT + OWN_SHM + HOST_SHM, "/dev/shm") is None  # the last mount is seen
    assert fork_server.mounted_own_tmpfs(ROOT + OWN_SHM.replace("/dev/shm", "/dev/shm/x"), "/dev/shm") is None
    bind = "613 29 252:0 /tmp/x /dev/shm rw - ext4 kz-tmpfs rw\n"  # a source named so, but no tmpfs
    assert fork_server.mounted_own_tmpfs(ROOT + bind, "/dev/shm") is None
    assert fork_server.mounted_own_tmpfs("", "/dev/shm") is None


def test_this_process_has_no_tmpfs_of_its_own():
    assert not fork_server.own_tmpfs("/dev/shm")  # pytest runs outside any kz sandbox


def test_emptying_removes_what_a_candidate_hid_and_nothing_outside(tmp_path):
    shm, outside = tmp_path / "shm", tmp_path / "outside"
    shm.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("not the server's")
    (shm / "plain").write_text("left")
    nested = shm / "a" / "b" / "c"
    nested.mkdir(parents=True)
    (nested / "deep").write_text("left")
    locked = shm / "locked"
    locked.mkdir()
    (locked / "inside").write_text("left")
    os.chmod(locked, 0)  # the server has no CAP_DAC_OVERRIDE: it must chmod first
    os.symlink(outside, shm / "link-to-outside")
    os.mkfifo(shm / "fifo")
    os.chmod(shm, 0o555)  # the candidate owns the root: the next request could not write there
    os.setxattr(shm, "user.note", b"for the next request")
    assert fork_server.empty_directory(str(shm))
    assert os.listdir(shm) == []
    assert (outside / "keep").read_text() == "not the server's"  # a link is removed, not followed
    assert os.stat(shm).st_mode == stat.S_IFDIR | 0o1777
    assert fork_server.candidates_attributes(str(shm)) == []


def test_what_cannot_be_emptied_is_reported(tmp_path):
    assert not fork_server.empty_directory(str(tmp_path / "missing"))
